"""What the shipped weights and this code must agree on: the network's feature columns, by name and scale.

`model.features` computes the columns in this order and `model.network` reads them by name; training records
the names in the weights' `config.json` (`features`; the file is read and written by `model.weights_meta`), and
loading checks them, so a reordered, added or removed column stops start-up with one line instead of giving wrong
answers. `check_weights_dir` is the check of a whole folder (its files, its network file whole: `check_network_file`,
its config and an adapted folder's parts), at start and at a swap alike; `check_weights` is the start-up's, run beside
`machine.check_device` wherever the service starts (server/gunicorn_conf.py, `python -m api`, `api.create_app`), which
also checks the masked LM (`MLM_DIR`) a folder was fitted with (`check_masked_lm`). Pure: no numpy, no torch, so that
gunicorn's master can check a weights folder before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

from config import Config, ConfigError
from model.masked_lm import MaskedLMError, check_folder
from model.weights_meta import (
    NETWORK_FILE,
    WEIGHTS_FILES,
    FeatureColumns,
    MaskedLMRecord,
    WeightsMeta,
    WeightsMetaError,
)

# Scales that bring each column near [-1, 1] (their units in the names of the columns they divide).
LOG_FREQ_SCALE = 16.0  # natural log of a character's corpus frequency
LM_DELTA_SCALE = 5.0  # natural log of the bigram LM's probability, candidate minus keep (clipped, below)
LM_DELTA_CLIP = 3.0  # lm_delta is clipped to [-LM_DELTA_CLIP, LM_DELTA_CLIP]
EDGE_COUNT_SCALE = 8.0  # log(1 + count) of a candidate's edge bigram
ALTERNATIVES_SCALE = 9.0  # distinct segments the other hypotheses offer at a position
HYPOTHESES_SCALE = 10.0  # hypotheses in the list


class CandidateFeatures(NamedTuple):
    """One candidate of one TOP1 position (a row of `cand_feats`)."""

    keep: float  # 1 for TOP1's own character (candidate 0)
    vote_share: float  # share of the hypotheses that offer this segment
    best_rank_inverse: float  # 1 / (1 + best rank offering it); 0 when none does
    deletion: float  # the segment is empty
    insertion: float  # the segment has two characters
    same_tone: float  # same syllable and tone as TOP1's character
    other_tone: float  # same syllable, another tone
    near_syllable: float  # a near syllable (zh/z, n/l, -n/-ng, ...)
    not_offered: float  # no hypothesis offers it (a sound-alike from the confusion set)
    log_freq: float  # mean log frequency of its characters / LOG_FREQ_SCALE
    offered_by_second: float  # the second hypothesis offers it
    lm_delta: float  # bigram LM of TOP1's neighbours with it in place, minus keep's, / LM_DELTA_SCALE, clipped
    left_edge_count: float  # log1p(count of the left edge bigram) / EDGE_COUNT_SCALE
    right_edge_count: float  # log1p(count of the right edge bigram) / EDGE_COUNT_SCALE


class PositionFeatures(NamedTuple):
    """One TOP1 position (a row of `pos_feats`)."""

    agreement: float  # share of the hypotheses that keep TOP1's character
    alternatives: float  # distinct other segments offered / ALTERNATIVES_SCALE
    hypotheses: float  # hypotheses in the list / HYPOTHESES_SCALE
    unknown_char: float  # TOP1's character is outside the vocabulary
    position: float  # index / MAX_LEN


CANDIDATE_FEATURES: tuple[str, ...] = CandidateFeatures._fields
POSITION_FEATURES: tuple[str, ...] = PositionFeatures._fields


class FeatureContractError(ValueError):
    """The weights were trained on other feature columns than this code computes."""


SCALES = {"log_freq": LOG_FREQ_SCALE, "lm_delta": LM_DELTA_SCALE, "edge_count": EDGE_COUNT_SCALE,
          "alternatives": ALTERNATIVES_SCALE, "hypotheses": HYPOTHESES_SCALE}


def feature_names() -> dict[str, list[str]]:
    """Return the columns as the weights' config records them."""
    return {"candidate": list(CANDIDATE_FEATURES), "position": list(POSITION_FEATURES)}


def feature_columns() -> FeatureColumns:
    """Return the columns and scales this code computes, as the weights' config records them."""
    return FeatureColumns(CANDIDATE_FEATURES, POSITION_FEATURES, dict(SCALES))


def check_features(recorded: FeatureColumns, source: str = "weights") -> None:
    """Raise FeatureContractError when a weights config names other columns than the code computes."""
    for kind, names in feature_names().items():
        theirs = list(getattr(recorded, kind))
        if theirs != names:
            missing = [n for n in names if n not in theirs]
            extra = [n for n in theirs if n not in names]
            detail = f"missing {missing}, unknown {extra}" if missing or extra else "same names in another order"
            raise FeatureContractError(f"{source} were trained on other {kind} features than this code computes:"
                                       f" {detail}")
    if recorded.scales != SCALES:
        raise FeatureContractError(f"{source} were trained with feature scales {recorded.scales},"
                                   f" this code uses {SCALES}")


class IncompleteWeightsError(FeatureContractError):
    """A weights folder lacks a part its config names, or holds a part of another run."""


def check_weights_dir(weights_dir: Path) -> WeightsMeta:
    """Check a weights folder before anything loads it: its files, every field of its config, its feature columns
    and, for an adapted folder, that every part `adaptation.files` names is there with the recorded sha256 (raises
    FeatureContractError). Return its config."""
    weights_dir = Path(weights_dir)
    missing = [name for name in WEIGHTS_FILES if not (weights_dir / name).is_file()]
    if missing:
        raise IncompleteWeightsError(f"{weights_dir} is incomplete: {', '.join(missing)} missing")
    check_network_file(weights_dir / NETWORK_FILE)
    try:
        meta = WeightsMeta.load(weights_dir)
    except WeightsMetaError as e:
        raise FeatureContractError(str(e)) from None
    check_features(meta.features, source=f"the weights in {weights_dir}")
    if meta.adaptation is None:
        return meta
    if meta.adaptation.provenance is None:
        raise IncompleteWeightsError(f"{weights_dir} is an unfinished adapted folder: no provenance, which "
                                     f"learn.adapt writes last (re-run python -m learn.adapt)")
    for part, entry in meta.adaptation.files.items():
        file = weights_dir / entry.name
        if not file.is_file():
            raise IncompleteWeightsError(f"{weights_dir} is an incomplete adapted folder: its {part} file "
                                         f"{entry.name!r} is missing (re-run python -m learn.adapt)")
        if sha256(file) != entry.sha256:
            raise IncompleteWeightsError(f"{weights_dir} is inconsistent: {entry.name} is not the {part} this "
                                         f"folder was adapted with (sha256 differs; re-run python -m learn.adapt)")
    return meta


def check_network_file(path: Path) -> None:
    """Refuse a network file that is no whole safetensors file, before torch reads it: its header (8 bytes of length,
    then JSON) must be whole and name tensors whose bytes end where the file does. A file cut short (a copy that
    stopped) is found here, at start and at a swap alike, instead of by every worker's loader, which would answer
    TOP1 for ever (raises IncompleteWeightsError)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                raise ValueError(f"its header says {length} bytes, the file holds {size}")
            header = json.loads(f.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise IncompleteWeightsError(f"{path} is no whole safetensors file (cut short?): {e}") from None
    if 8 + length + max(ends, default=0) != size:
        raise IncompleteWeightsError(f"{path} is cut short or padded: its tensors end at byte "
                                     f"{8 + length + max(ends, default=0)}, the file at {size} (copy it again)")


def check_weights(config: Config) -> WeightsMeta:
    """Stop the start in one line (ConfigError naming `weights_dir`, or `mlm_dir`) when the configured weights folder
    would load and give wrong answers, or fail late: the start-up's check, beside `machine.check_device`. Return its
    config. A masked LM (`mlm_dir`) is checked where the served stage weighs one: the folder it was fitted with."""
    try:
        meta = check_weights_dir(config.weights_dir)
    except FeatureContractError as e:
        raise ConfigError(f"weights_dir: {e}") from None
    fitted = meta.rerank.get(config.stage)
    if fitted is not None and fitted.weights.get("mlm"):
        try:
            mlm_dir = Path(config.mlm_dir).expanduser() if config.mlm_dir else None
            check_masked_lm(mlm_dir, meta.masked_lm, config.weights_dir)
        except MaskedLMError as e:
            raise ConfigError(f"mlm_dir: {e}") from None
    return meta


def ignored_masked_lm(config: Config, meta: WeightsMeta) -> str | None:
    """The warning for an `mlm_dir` the served stage does not weigh (a folder fitted without it: the shipped one), or
    None."""
    fitted = meta.rerank.get(config.stage)
    if not config.mlm_dir or (fitted is not None and fitted.weights.get("mlm")):
        return None
    return (f"MLM_DIR={config.mlm_dir} is ignored: the {config.stage!r} stage of {config.weights_dir} was fitted "
            f"without a masked LM (make adapt ... MLM_DIR=DIR fits one that weighs it)")


def check_masked_lm(folder: Path | None, record: MaskedLMRecord | None, weights_dir: Path) -> None:
    """Refuse serving `weights_dir`, whose stage weighs the masked LM `record` names, with `folder` (None: no
    MLM_DIR) unless `folder` holds that model's weights (same sha256); MaskedLMError in one line."""
    if record is None:
        raise MaskedLMError(f"{weights_dir} weighs a masked LM but does not say which (no masked_lm in its "
                            f"config.json): re-run make adapt")
    fitted = (f"{weights_dir} was fitted with the masked LM at {record.path} ({record.file}, sha256 "
              f"{record.sha256[:12]})")
    if folder is None:
        raise MaskedLMError(f"{fitted}: set MLM_DIR to that folder (or serve a folder fitted without one)")
    weights = check_folder(folder)
    if sha256(weights) != record.sha256:
        raise MaskedLMError(f"{fitted}, and MLM_DIR={folder} holds another ({weights.name}'s sha256 differs): set "
                            f"MLM_DIR to the model it was fitted with")


def sha256(path: Path) -> str:
    """Return the hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
