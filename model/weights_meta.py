"""A weights folder's `config.json` as one typed, frozen record: `WeightsMeta`.

`WeightsMeta.load(folder)` reads the file whole and checks every field, raising `WeightsMetaError` in one line that
names the bad one ("…/config.json: threshold must be a number, got 'high'"); `save(folder)` writes the file whole
(a temporary file beside it, then a rename), so a reader never sees half of it. Every reader and writer of the file
goes through here: the corrector's `setup()`, the start-up check (`model.contract.check_weights_dir`), and
`learn.train`, `learn.tune`, `learn.evaluate --write` and `learn.adapt`. A record is changed with `replace()` and saved
again, never edited in place.

The layout is the one written since the weights first recorded their features (a folder from 427ba62, shipped or
adapted, loads: tests/model/test_weights_meta.py). Whether the recorded feature columns are the ones this code
computes is `model.contract`'s question, not this module's. Pure (json and dataclasses): the start-up check
(`model.contract.check_weights`) reads a folder with it before torch is imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config import STAGES

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
NETWORK_FILE = "model.safetensors"
WEIGHTS_FILES = (CONFIG_FILE, VOCAB_FILE, NETWORK_FILE)  # what every weights folder holds
# The second stage's fitted variants: every stage but "net", the network alone.
RERANK_STAGES = tuple(stage for stage in STAGES if stage != "net")
# a stage's weights: `model.rerank.RerankWeights`'s fields (it checks that they are these, in this order)
RERANK_FIELDS = ("lm", "taiwan", "net", "rank", "outside_nbest", "changes", "oov", "domain", "confusion", "mlm",
                 "margin", "net_only", "rule_trust", "rule_domain", "rule_margin")
# the abstain gate's features (`model.gate` computes them; a stage's "gate" weighs them by these names)
GATE_FEATURES = (
    "lead",  # the linear score's lead over TOP1
    "lm", "net", "rank", "outside_nbest", "changes", "oov", "taiwan",  # the candidate's own `model.rerank.Features`
    "several",  # 1 when the list holds more than TOP1
    "support_min",  # over the changed positions, the least share of other hypotheses holding the change
    "support_mean",  # the same, averaged
    "lm_per_change",  # the trigram's gain per changed position
    "net_best",  # 1 when no candidate has a higher network score
)
DEFAULT_NAME = "nbest-candidate-corrector"
_SHOWN_CHARS = 60  # of a bad value, in the error's one line


class WeightsMetaError(ValueError):
    """A weights folder's config.json is missing, unreadable, or holds a field of the wrong type; one line."""


@dataclass(frozen=True)
class NetShape:
    """The network's sizes (`model.network.NetConfig`'s fields)."""

    n_chars: int
    n_syllables: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    dropout: float


@dataclass(frozen=True)
class FeatureColumns:
    """The feature columns, by name, and their scales, that the network was trained on."""

    candidate: tuple[str, ...]
    position: tuple[str, ...]
    scales: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": list(self.candidate), "position": list(self.position), "scales": dict(self.scales)}


@dataclass(frozen=True)
class RerankStage:
    """One fitted variant of the second stage: its weights (`model.rerank.RerankWeights`'s fields) and the figures
    of the lists it was fitted on."""

    weights: dict[str, float | bool]
    dev: dict[str, Any] | None = None
    # `model.gate.Gate`'s fields: {"weights": {feature: weight}, "margin": m}, and "focus_scatter" and "focus_margin"
    # where the gate answers focused lists by the lead alone
    gate: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return ({"weights": dict(self.weights)} | ({"dev": self.dev} if self.dev is not None else {})
                | ({"gate": self.gate} if self.gate is not None else {}))


@dataclass(frozen=True)
class PartFile:
    """One file an adapted folder adds, with its sha256."""

    name: str
    sha256: str


@dataclass(frozen=True)
class AdaptationRecord:
    """What `learn.adapt` added: its files and, written last, the provenance of the run (None: an unfinished
    folder)."""

    files: dict[str, PartFile]
    provenance: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        files = {part: dataclasses.asdict(f) for part, f in self.files.items()}
        return {"files": files} | ({"provenance": self.provenance} if self.provenance is not None else {})


@dataclass(frozen=True)
class MaskedLMRecord:
    """The masked LM (`MLM_DIR`, `model.masked_lm`) a folder's second stage was fitted with: where it was, its weights
    file and that file's sha256 (what is checked: the same model may lie elsewhere on the serving machine)."""

    path: str
    file: str
    sha256: str


@dataclass(frozen=True)
class WeightsMeta:
    """A weights folder's config.json: what the network is, how it answers, and where it came from."""

    net: NetShape
    features: FeatureColumns
    threshold: float  # the network alone changes a character when its candidate's p >= threshold
    name: str = DEFAULT_NAME
    version: str | None = None
    trained: dict[str, Any] | None = None  # learn.train's provenance: steps, examples, settings, dev figures
    evaluation: dict[str, Any] | None = None  # learn.evaluate --write's figures, per set
    adaptation: AdaptationRecord | None = None  # learn.adapt's files and provenance
    rerank: dict[str, RerankStage] = field(default_factory=dict)  # by stage (RERANK_STAGES)
    masked_lm: MaskedLMRecord | None = None  # the masked LM a stage weighs (its `mlm` weight not 0), when one does

    @classmethod
    def load(cls, folder: Path) -> WeightsMeta:
        """Read `folder`'s config.json and check every field (raises WeightsMetaError naming the bad one)."""
        path = Path(folder) / CONFIG_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise WeightsMetaError(f"cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise WeightsMetaError(f"{path} is not JSON: {e}") from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, source: str = CONFIG_FILE) -> WeightsMeta:
        """Check a parsed config.json field by field; `source` begins the error's line."""
        return _Reader(source).meta(raw)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object config.json holds, in the order it has always been written."""
        out: dict[str, Any] = {"name": self.name}
        if self.version is not None:
            out["version"] = self.version
        out |= {"net": dataclasses.asdict(self.net), "features": self.features.to_dict(), "threshold": self.threshold}
        if self.trained is not None:
            out["trained"] = self.trained
        if self.evaluation is not None:
            out["evaluation"] = self.evaluation
        if self.adaptation is not None:
            out["adaptation"] = self.adaptation.to_dict()
        if self.masked_lm is not None:
            out["masked_lm"] = dataclasses.asdict(self.masked_lm)
        return out | {"rerank": {stage: fitted.to_dict() for stage, fitted in self.rerank.items()}}

    def save(self, folder: Path) -> Path:
        """Write config.json into `folder` whole: a temporary file beside it, renamed over it. Return its path."""
        folder = Path(folder)
        path = folder / CONFIG_FILE
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=f".{CONFIG_FILE}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, _mode_for(path))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def replace(self, **changes: Any) -> WeightsMeta:
        """A copy with `changes` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)

    def with_stage(self, stage: str, fitted: RerankStage) -> WeightsMeta:
        """A copy with `stage`'s second stage replaced by `fitted`."""
        return self.replace(rerank={**self.rerank, stage: fitted})


def _mode_for(path: Path) -> int:
    """The replaced file's permissions; a new file's as the umask allows (mkstemp's own are 0600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


class _Reader:
    """Check a parsed config.json, naming each field by its dotted path in the error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, name: str, wanted: str, value: Any) -> WeightsMetaError:
        shown = repr(value)
        if len(shown) > _SHOWN_CHARS:
            shown = shown[: _SHOWN_CHARS - 3] + "..."
        return WeightsMetaError(f"{self.source}: {name} must be {wanted}, got {shown}")

    def obj(self, raw: Any, name: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(name, "a JSON object", raw)
        prefix = f"{name}." if name != "config" else ""
        for key in raw:
            if key not in required and key not in optional:
                raise WeightsMetaError(f"{self.source}: {prefix}{key} is not a field this code knows (known: "
                                       f"{', '.join((*required, *optional))})")
        for key in required:
            if key not in raw:
                raise WeightsMetaError(f"{self.source}: {prefix}{key} is missing")
        return raw

    def free(self, raw: Any, name: str) -> dict[str, Any] | None:
        """A record whose inside is figures and settings for people to read: any JSON object, or null."""
        if raw is not None and not isinstance(raw, dict):
            raise self.fail(name, "a JSON object or null", raw)
        return raw

    def number(self, raw: Any, name: str) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or math.isnan(raw):
            raise self.fail(name, "a number", raw)
        return raw

    def count(self, raw: Any, name: str) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise self.fail(name, "a whole number >= 1", raw)
        return raw

    def text(self, raw: Any, name: str) -> str:
        if not isinstance(raw, str):
            raise self.fail(name, "a string", raw)
        return raw

    def names(self, raw: Any, name: str) -> tuple[str, ...]:
        if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
            raise self.fail(name, "a list of strings", raw)
        return tuple(raw)

    def meta(self, raw: Any) -> WeightsMeta:
        known = tuple(f.name for f in dataclasses.fields(WeightsMeta))
        required = ("net", "features", "threshold")
        raw = self.obj(raw, "config", required, tuple(k for k in known if k not in required))
        threshold = self.number(raw["threshold"], "threshold")
        if threshold < 0:
            raise self.fail("threshold", "a number >= 0", threshold)
        name = self.text(raw.get("name", DEFAULT_NAME), "name")
        version = self.text(raw["version"], "version") if raw.get("version") is not None else None
        return WeightsMeta(net=self.net(raw["net"]), features=self.features(raw["features"]), threshold=threshold,
                           name=name, version=version, trained=self.free(raw.get("trained"), "trained"),
                           evaluation=self.free(raw.get("evaluation"), "evaluation"),
                           adaptation=self.adaptation(raw["adaptation"]) if "adaptation" in raw else None,
                           rerank=self.rerank(raw.get("rerank", {})),
                           masked_lm=self.masked_lm(raw["masked_lm"]) if raw.get("masked_lm") is not None else None)

    def masked_lm(self, raw: Any) -> MaskedLMRecord:
        raw = self.obj(raw, "masked_lm", ("path", "file", "sha256"))
        return MaskedLMRecord(self.text(raw["path"], "masked_lm.path"), self.text(raw["file"], "masked_lm.file"),
                              self.digest(raw["sha256"], "masked_lm.sha256"))

    def digest(self, raw: Any, name: str) -> str:
        digest = self.text(raw, name)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise self.fail(name, "64 lowercase hex digits", digest)
        return digest

    def net(self, raw: Any) -> NetShape:
        sizes = tuple(f.name for f in dataclasses.fields(NetShape) if f.name != "dropout")
        raw = self.obj(raw, "net", (*sizes, "dropout"))
        dropout = self.number(raw["dropout"], "net.dropout")
        if not 0 <= dropout < 1:
            raise self.fail("net.dropout", "a number in [0, 1)", dropout)
        return NetShape(**{k: self.count(raw[k], f"net.{k}") for k in sizes}, dropout=dropout)

    def features(self, raw: Any) -> FeatureColumns:
        raw = self.obj(raw, "features", ("candidate", "position", "scales"))
        scales = raw["scales"]
        if not isinstance(scales, dict):
            raise self.fail("features.scales", "a JSON object", scales)
        return FeatureColumns(self.names(raw["candidate"], "features.candidate"),
                              self.names(raw["position"], "features.position"),
                              {k: self.number(v, f"features.scales.{k}") for k, v in scales.items()})

    def rerank(self, raw: Any) -> dict[str, RerankStage]:
        raw = self.obj(raw, "rerank", (), RERANK_STAGES)
        return {stage: self.stage(fitted, f"rerank.{stage}") for stage, fitted in raw.items()}

    def stage(self, raw: Any, name: str) -> RerankStage:
        raw = self.obj(raw, name, ("weights",), ("dev", "gate"))
        weights = self.obj(raw["weights"], f"{name}.weights", (), RERANK_FIELDS)
        checked: dict[str, float | bool] = {}
        for key, value in weights.items():
            checked[key] = value if isinstance(value, bool) else self.number(value, f"{name}.weights.{key}")
        gate = self.gate(raw["gate"], f"{name}.gate") if "gate" in raw else None
        return RerankStage(checked, self.free(raw.get("dev"), f"{name}.dev"), gate)

    def gate(self, raw: Any, name: str) -> dict[str, Any]:
        raw = self.obj(raw, name, ("weights", "margin"), ("focus_scatter", "focus_margin"))
        weights = self.obj(raw["weights"], f"{name}.weights", (), GATE_FEATURES)
        focus = {k: self.number(raw[k], f"{name}.{k}") for k in ("focus_scatter", "focus_margin") if k in raw}
        return {"weights": {k: self.number(v, f"{name}.weights.{k}") for k, v in weights.items()},
                "margin": self.number(raw["margin"], f"{name}.margin")} | focus

    def adaptation(self, raw: Any) -> AdaptationRecord:
        raw = self.obj(raw, "adaptation", ("files",), ("provenance",))
        files = raw["files"]
        if not isinstance(files, dict):
            raise self.fail("adaptation.files", "a JSON object", files)
        parts = {}
        for part, entry in files.items():
            name = f"adaptation.files.{part}"
            entry = self.obj(entry, name, ("name", "sha256"))
            file_name = self.text(entry["name"], f"{name}.name")
            if not file_name or Path(file_name).name != file_name:
                raise self.fail(f"{name}.name", "a file name inside the folder", file_name)
            parts[part] = PartFile(file_name, self.digest(entry["sha256"], f"{name}.sha256"))
        provenance = self.free(raw["provenance"], "adaptation.provenance") if "provenance" in raw else None
        return AdaptationRecord(parts, provenance)
