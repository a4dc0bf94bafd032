"""Read and write labelled n-best lists: the competition's official training file, or JSONL of its rows.

A row is an object `{"id", "ground_truth_sentence", "sentence_list", "phoneme_sequence_list"}`. The official
file is one JSON list of rows; JSONL holds one row per line. The format is told by the first character besides
whitespace (`[`: a JSON list, anything else: JSONL); UTF-8 with or without a byte-order mark.

Lenient where the judge is (`api.schemas` reads requests the same way):

- keys besides the four are ignored;
- `phoneme_sequence_list` may be shorter than `sentence_list`, empty, absent or null (read as empty);
- every hypothesis is kept, also past the judge's 10 and also blank ones: a reader drops nothing. The service
  reads only the first `max_hypotheses` (10), and `learn.train` trims to the same number;
- characters are kept as they are: the truth loses only its whitespace (the judge's truths hold Chinese
  characters only; `learn.train` trains on the Han characters of a truth, as the judge scores).

Anything else stops the read with a `LabelledFormatError` naming the file, the row (line for JSONL, from 1;
index for a JSON list, from 0), its id when known, and what is wrong: a row that is not an object; an `id` that
is missing, empty, repeated or neither a string nor an integer (an integer is read as its decimal string); a
`ground_truth_sentence` missing, not a string or blank; a `sentence_list` missing, empty or not a list of
strings; a `phoneme_sequence_list` that is present and not a list of strings; a file with no row. Ids must be
unique because the dev split and the judge's `esun_uuid` are derived from them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preprocess.text import NBest, strip_spaces

MAX_SHOWN_CHARS = 60


@dataclass(frozen=True)
class Labelled:
    """One labelled question: its id, the truth (whitespace removed) and the recogniser's n-best list."""

    id: str
    truth: str
    nbest: NBest


class LabelledFormatError(ValueError):
    """A labelled file that cannot be read; the message names the file, the row and what is wrong."""


def read_labelled(path: Path) -> list[Labelled]:
    """Read a labelled file (a JSON list of rows, or JSONL); raise LabelledFormatError on any bad row."""
    read = _read(Path(path), strict=True)
    return read.items


@dataclass(frozen=True)
class LabelledRead:
    """What a lenient read found: the good rows, and one line per malformed row naming it and its problem."""

    items: list[Labelled]
    malformed: list[str]


def read_labelled_lenient(path: Path) -> LabelledRead:
    """Read a labelled file, naming and counting malformed rows instead of stopping at the first one.

    A file that cannot be read at all (not UTF-8, not JSON where a JSON list is expected, no good row) still
    raises LabelledFormatError.
    """
    return _read(Path(path), strict=False)


def _read(path: Path, strict: bool) -> LabelledRead:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise LabelledFormatError(f"{path}: not UTF-8 (byte {e.start})") from None
    rows = _json_rows(path, text) if text.lstrip()[:1] == "[" else _jsonl_rows(path, text, strict)
    items: list[Labelled] = []
    malformed: list[str] = []
    first_at: dict[str, str] = {}
    for where, row in rows:
        try:
            if isinstance(row, LabelledFormatError):
                raise row
            item = _parse_row(path, where, row)
            if item.id in first_at:
                raise LabelledFormatError(f"{path}: {where} (id {item.id!r}): duplicate id, first at "
                                          f"{first_at[item.id]}")
        except LabelledFormatError as e:
            if strict:
                raise
            malformed.append(str(e))
            continue
        first_at[item.id] = where
        items.append(item)
    if not items:
        raise LabelledFormatError(f"{path}: no rows" + (f" that can be read ({len(malformed)} malformed, first: "
                                                        f"{malformed[0]})" if malformed else ""))
    return LabelledRead(items, malformed)


def write_labelled(items: Iterable[Labelled], path: Path) -> None:
    """Write labelled items as JSONL, one row per line, in the official file's keys."""
    lines = [json.dumps({"id": item.id, "ground_truth_sentence": item.truth,
                         "sentence_list": list(item.nbest.sentences),
                         "phoneme_sequence_list": list(item.nbest.phonemes)}, ensure_ascii=False)
             for item in items]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def is_dev(item_id: str, dev_share: float) -> bool:
    """Tell whether an id falls in the held-out dev share, by a stable hash of the id."""
    bucket = int.from_bytes(hashlib.sha256(f"dev:{item_id}".encode()).digest()[:8], "big") / 2**64
    return bucket < dev_share


def split_dev(items: list[Labelled], dev_share: float) -> tuple[list[Labelled], list[Labelled]]:
    """Split items into (train, dev) by a stable hash of their ids, keeping their order."""
    dev = [is_dev(item.id, dev_share) for item in items]
    return [i for i, d in zip(items, dev, strict=True) if not d], [i for i, d in zip(items, dev, strict=True) if d]


@dataclass(frozen=True)
class Split:
    """Items split by id into train, dev (to choose weights and margins) and test (held out, only reported)."""

    train: list[Labelled]
    dev: list[Labelled]
    test: list[Labelled]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev), "test": len(self.test)}


def split_three(items: list[Labelled], dev_share: float, test_share: float, seed: int) -> Split:
    """Split items into train / dev / test by a seeded hash of their ids (stable across runs and file orders)."""
    parts: dict[str, list[Labelled]] = {"train": [], "dev": [], "test": []}
    for item in items:
        bucket = int.from_bytes(hashlib.sha256(f"{seed}:{item.id}".encode()).digest()[:8], "big") / 2**64
        part = "test" if bucket < test_share else "dev" if bucket < test_share + dev_share else "train"
        parts[part].append(item)
    return Split(parts["train"], parts["dev"], parts["test"])


def _json_rows(path: Path, text: str) -> list[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LabelledFormatError(f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(data, list):
        raise LabelledFormatError(f"{path}: a JSON file must hold a list of rows, got {type(data).__name__}")
    return [(f"index {i}", row) for i, row in enumerate(data)]


def _jsonl_rows(path: Path, text: str, strict: bool = True) -> list[tuple[str, Any]]:
    """Parse JSONL rows; a line that is not JSON raises when strict, else stands in the list as its error."""
    rows: list[tuple[str, Any]] = []
    # split on "\n" only: str.splitlines would also cut at U+2028 and others, which JSON strings may hold raw
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as e:
            error = LabelledFormatError(f"{path}: line {number}: not valid JSON at column {e.colno}: {e.msg}")
            if strict:
                raise error from None
            rows.append((f"line {number}", error))
    return rows


def _parse_row(path: Path, where: str, row: Any) -> Labelled:
    if not isinstance(row, dict):
        raise LabelledFormatError(f"{path}: {where}: a row must be a JSON object, got {_shown(row)}")
    item_id, id_problem = _read_id(row)
    label = f"{where} (id {item_id!r})" if item_id is not None else where

    def fail(problem: str) -> LabelledFormatError:
        return LabelledFormatError(f"{path}: {label}: {problem}")

    if item_id is None:
        raise fail(id_problem)
    truth = row.get("ground_truth_sentence")
    if not isinstance(truth, str) or not strip_spaces(truth):
        raise fail(f"ground_truth_sentence must be a non-blank string, got {_got(row, 'ground_truth_sentence')}")
    sentences = row.get("sentence_list")
    if not _is_str_list(sentences) or not sentences:
        raise fail(f"sentence_list must be a non-empty list of strings, got {_got(row, 'sentence_list')}")
    phonemes = row.get("phoneme_sequence_list")
    if phonemes is None:
        phonemes = []
    if not _is_str_list(phonemes):
        raise fail(f"phoneme_sequence_list must be a list of strings when present, got {_shown(phonemes)}")
    return Labelled(item_id, strip_spaces(truth), NBest(tuple(sentences), tuple(phonemes)))


def _read_id(row: dict[str, Any]) -> tuple[str | None, str]:
    """Return (the id as a string, "") or (None, what is wrong with it)."""
    value = row.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), ""
    if isinstance(value, str) and value:
        return value, ""
    return None, f"id must be a non-empty string or an integer, got {_got(row, 'id')}"


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _got(row: dict[str, Any], key: str) -> str:
    return _shown(row[key]) if key in row else "no such key"


def _shown(value: Any) -> str:
    """Describe a bad value briefly: its JSON, cut to MAX_SHOWN_CHARS."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 1] + "…"
