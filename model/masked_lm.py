"""A team's pretrained masked language model as one more feature of the second stage (`MLM_DIR`).

Any Hugging Face masked-LM folder whose tokenizer holds Chinese characters as single tokens (BERT, MacBERT,
RoBERTa-wwm-ext, ALBERT, ELECTRA's generator...: their tokenizer and weights in the folder), read with transformers
from the folder alone, never from the network. For each candidate sentence of a list (`model.rerank`) it gives
`mlm`: the masked LM's log-probability gain of the candidate's changed characters over TOP1's.

How a candidate is scored: its changes against TOP1 are cut into spans (maximal runs of changed TOP1 positions);
each span is masked in TOP1 (the rest of TOP1 as its context) once with as many `[MASK]`s as TOP1's characters there
and once with as many as the candidate's, and the gain is the sum over spans of the candidate's characters'
log-probabilities at their masks minus TOP1's at theirs, the candidate's taken per character times TOP1's length
there (a shorter span is not likelier for being shorter). Where the two are equally long (most sound-alike errors)
both read the same masked sentence, so one forward row serves TOP1 and every candidate changing that span; where the
candidate deletes the span, the span is widened by the unchanged character after it (before it at the end), so
that both sides score something. Rows are deduplicated over the batch, sorted by length and run in a few padded
forward passes on the network's device (fp16 on CUDA); a list whose candidates are all TOP1 asks nothing.

Checked before anything loads it (`check_folder`, pure: no torch), as a weights folder is: its config.json, a
tokenizer file and a weights file; `MaskedLMError` in one line naming the folder. An adapted folder fitted with it
records its weights' sha256 (`model.weights_meta.MaskedLMRecord`), and is refused with any other
(`model.contract.check_masked_lm`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from model.weights_meta import CONFIG_FILE  # the name Hugging Face gives a model's config too

log = logging.getLogger(__name__)

# what a masked-LM folder holds: one weights file (safetensors, or the older pickle), one tokenizer description
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
# frequent characters of Taiwan text: a tokenizer that knows fewer than half of them as tokens is no Chinese model
COMMON_CHARS = "的一是不了人我在有他這為之大來以個中上們到說國和地也子時道出而要於就下得可你年生"
MAX_ROWS = 256  # masked sentences per forward pass
MAX_POSITIONS = 512  # a model's limit when its config names none


class MaskedLMError(ValueError):
    """A masked-LM folder is missing, incomplete, unreadable, or not the one an adapted folder was fitted with."""


def weights_file(folder: Path) -> Path:
    """The folder's weights file (raises MaskedLMError where it holds none)."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise MaskedLMError(f"{folder} holds no masked-LM weights ({' or '.join(WEIGHT_FILES)}; a sharded checkpoint "
                        f"is not read: save it with save_pretrained(..., max_shard_size='10GB'))")


def check_folder(folder: Path) -> Path:
    """Check a masked-LM folder's files before torch reads them: a folder, a config.json naming its `model_type`, a
    tokenizer file and a weights file. Return the weights file (raises MaskedLMError in one line)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MaskedLMError(f"{folder} is not a folder")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except OSError as e:
        raise MaskedLMError(f"{folder} holds no readable config.json ({e.strerror or e}): is it a Hugging Face "
                            f"model folder?") from None
    except ValueError as e:
        raise MaskedLMError(f"{folder}/config.json is not JSON: {e}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise MaskedLMError(f"{folder}/config.json names no model_type: is it a Hugging Face model folder?")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise MaskedLMError(f"{folder} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): copy the tokenizer's files "
                            f"into the folder beside the model (save_pretrained of both)")
    return weights_file(folder)


def spans(top1: str, choice: Sequence[str]) -> list[tuple[int, int]]:
    """The maximal runs [start, end) of TOP1 positions a candidate changes."""
    out: list[tuple[int, int]] = []
    for i, (seg, char) in enumerate(zip(choice, top1, strict=True)):
        if seg == char:
            continue
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _span_sides(top1: str, choice: Sequence[str], start: int, end: int) -> tuple[int, int, str, str] | None:
    """A span's TOP1 characters and the candidate's, widened by one unchanged neighbour where the candidate deletes
    the span; None where nothing is left to widen by (the candidate deletes all of TOP1)."""
    mine = "".join(choice[start:end])
    if not mine:
        if end < len(top1):
            end += 1
            mine = choice[end - 1]
        elif start > 0:
            start -= 1
            mine = choice[start]
        else:
            return None
    return start, end, top1[start:end], mine


class MaskedLM:
    """A masked LM loaded from a local folder, scoring candidates' changed characters against TOP1's."""

    def __init__(self, folder: Path, device: str | object = "cpu", cpu_precision: str = "int8") -> None:
        import torch
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.folder = Path(folder)
        self.weights = check_folder(self.folder)
        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
            model = AutoModelForMaskedLM.from_pretrained(self.folder, local_files_only=True)
        except Exception as e:  # whatever transformers or safetensors raise on a broken folder: one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MaskedLMError(f"{self.folder} could not be loaded as a masked LM by transformers: {first}") from None
        self._ids = tokenizer.get_vocab()
        specials = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("cls", "sep", "mask", "pad", "unk")}
        missing = [name for name in ("mask", "unk") if specials[name] is None]
        if missing:
            raise MaskedLMError(f"{self.folder}'s tokenizer has no {' or '.join(missing)} token: not a masked LM's")
        known = sum(c in self._ids for c in COMMON_CHARS)
        if known < len(COMMON_CHARS) / 2:
            raise MaskedLMError(f"{self.folder}'s tokenizer holds {known} of {len(COMMON_CHARS)} frequent Chinese "
                                f"characters as tokens: a Chinese model's holds them all")
        self.mask_id, self.unk_id = int(specials["mask"]), int(specials["unk"])
        self.pad_id = int(specials["pad"]) if specials["pad"] is not None else 0
        self.prefix = [int(specials["cls"])] if specials["cls"] is not None else []
        self.suffix = [int(specials["sep"])] if specials["sep"] is not None else []
        self.max_len = int(getattr(model.config, "max_position_embeddings", None) or MAX_POSITIONS)
        model.eval()
        self.n_parameters = sum(p.numel() for p in model.parameters())
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.model = model.to(self.device, self.dtype)
        # the vocabulary's projection only at the masks, not at every position (for a Chinese BERT's 21,128 tokens, most
        # of a forward pass): its input cut down by a hook where the model names it (`get_output_embeddings`)
        self.precision = "fp16" if self.device.type == "cuda" else "fp32"
        if self.device.type == "cpu" and cpu_precision == "int8":  # as the corrector's network (model.corrector):
            from model.runtime import quantized  # twice as fast; a gain moves by a few thousandths with the batch

            self.model = quantized(self.model)  # a new module: the hook goes on its projection
            self.precision = "int8"
        self._keep: torch.Tensor | None = None
        head = self.model.get_output_embeddings()
        self._cut = isinstance(head, torch.nn.Module)
        if self._cut:
            head.register_forward_pre_hook(self._at_masks_only)

    def _at_masks_only(self, module: object, args: tuple) -> tuple | None:
        """The output projection's forward pre-hook: its input kept at the masked positions of the pass running."""
        return (args[0][self._keep], *args[1:]) if self._keep is not None else None

    def _id(self, char: str) -> int:
        return self._ids.get(char, self.unk_id)

    def gains(self, top1s: Sequence[str], choices: Sequence[Sequence[Sequence[str]]]) -> list[list[float]]:
        """For each list (its TOP1 and its candidates' segments at TOP1's positions), each candidate's gain: the
        masked LM's log-probability of its changed characters minus TOP1's (0 for TOP1, and for a span the model
        cannot read: a sentence longer than its positions)."""
        rows: dict[tuple[int, int, int, int], int] = {}  # (list, start, end, masks) -> row
        asks: list[list[list[tuple[int, str]]]] = []  # per list, per candidate: (row, characters), TOP1's then its own
        for k, (top1, cands) in enumerate(zip(top1s, choices, strict=True)):
            per_list = []
            for choice in cands:
                sides: list[tuple[int, str]] = []
                for start, end in spans(top1, choice):
                    widened = _span_sides(top1, choice, start, end)
                    if widened is None:
                        continue
                    a, b, theirs, mine = widened
                    if len(top1) - (b - a) + max(len(theirs), len(mine)) + 2 > self.max_len:
                        continue
                    for chars in (theirs, mine):  # TOP1's side, then the candidate's
                        sides.append((rows.setdefault((k, a, b, len(chars)), len(rows)), chars))
                per_list.append(sides)
            asks.append(per_list)
        if not rows:
            return [[0.0] * len(per_list) for per_list in asks]
        logp = self._log_probs(top1s, list(rows), asks)
        return [[sum((logp[mine_row, mine] * len(theirs) / len(mine) - logp[theirs_row, theirs]
                      for (theirs_row, theirs), (mine_row, mine) in zip(sides[::2], sides[1::2], strict=True)), 0.0)
                 for sides in per_list] for per_list in asks]

    def _log_probs(self, top1s: Sequence[str], keys: list[tuple[int, int, int, int]],
                   asks: list[list[list[tuple[int, str]]]]) -> dict[tuple[int, str], float]:
        """Run every masked sentence (`keys`: list, start, end, masks) and read the log-probabilities each side of
        `asks` needs at its masks."""
        import numpy as np
        import torch

        inputs = []
        for k, start, end, masks in keys:
            top1 = top1s[k]
            inputs.append([*self.prefix, *map(self._id, top1[:start]), *[self.mask_id] * masks,
                           *map(self._id, top1[end:]), *self.suffix])
        wanted: dict[int, set[str]] = {}
        for per_list in asks:
            for sides in per_list:
                for row, chars in sides:
                    wanted.setdefault(row, set()).add(chars)
        scores: dict[tuple[int, str], float] = {}  # (row, characters) -> their log-probability at its masks
        order = sorted(range(len(inputs)), key=lambda r: len(inputs[r]))
        with torch.inference_mode():
            for lo in range(0, len(order), MAX_ROWS):
                chunk = order[lo : lo + MAX_ROWS]
                lengths = np.array([len(inputs[r]) for r in chunk])
                ids = np.full((len(chunk), int(lengths.max())), self.pad_id, dtype=np.int64)
                for j, r in enumerate(chunk):
                    ids[j, : lengths[j]] = inputs[r]
                masked = ids == self.mask_id
                first = np.cumsum(masked.sum(axis=1)) - masked.sum(axis=1)  # each row's first mask among the chunk's
                # every (row, characters) asked, flattened: the mask each character sits at, its token, its pair
                pairs = [(r, chars) for j, r in enumerate(chunk) for chars in wanted.get(r, ())]
                starts = [first[j] for j, r in enumerate(chunk) for _ in wanted.get(r, ())]
                at = [start + q for (_, chars), start in zip(pairs, starts, strict=True) for q in range(len(chars))]
                token = [self._id(c) for _, chars in pairs for c in chars]
                pair = [p for p, (_, chars) in enumerate(pairs) for _ in chars]
                attention = torch.from_numpy(np.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
                keep = torch.from_numpy(masked).to(self.device)
                self._keep = keep if self._cut else None
                try:
                    logits = self.model(input_ids=torch.from_numpy(ids).to(self.device),
                                        attention_mask=attention.to(self.device)).logits
                finally:
                    self._keep = None
                at_masks = (logits if self._cut else logits[keep]).float()  # [M, V], in the masks' row-major order
                at_index = torch.tensor(at, device=self.device)
                logp = at_masks[at_index, torch.tensor(token, device=self.device)] - \
                    torch.logsumexp(at_masks, dim=-1)[at_index]
                sums = np.bincount(pair, weights=logp.cpu().double().numpy(), minlength=len(pairs))
                scores.update(zip(pairs, sums.tolist(), strict=True))
        return scores

    def describe(self) -> dict[str, object]:
        return {"path": str(self.folder), "model_type": getattr(self.model.config, "model_type", None),
                "parameters": self.n_parameters, "device": str(self.device), "precision": self.precision}
