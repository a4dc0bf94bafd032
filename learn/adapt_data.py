"""The labelled files an adaptation learns from (`learn.adapt`): read leniently, each malformed row named and
counted, and each row's n-best list as the service reads it (its first `MAX_HYPOTHESES` hypotheses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from learn.data.labelled import Labelled, read_labelled_lenient
from learn.train_data import MAX_HYPOTHESES
from model.contract import sha256
from preprocess.text import NBest

SHOWN_MALFORMED = 20  # malformed rows printed per file; the rest are counted


def read_files(paths: list[Path]) -> tuple[list[Labelled], list[dict[str, Any]]]:
    """Read every file leniently: print its rows and each malformed row; return the rows and a record per file."""
    items: list[Labelled] = []
    record = []
    seen: set[str] = set()
    for path in paths:
        read = read_labelled_lenient(path)
        dup = [it for it in read.items if it.id in seen]
        malformed = read.malformed + [f"{path}: id {it.id!r} already read from an earlier file" for it in dup]
        kept = [it for it in read.items if it.id not in seen]
        seen.update(it.id for it in kept)
        print(f"{path}: {len(kept)} rows read, {len(malformed)} malformed")
        long = sum(len(it.nbest.sentences) > MAX_HYPOTHESES for it in kept)
        if long:
            print(f"  {long} rows hold more than {MAX_HYPOTHESES} hypotheses: the first {MAX_HYPOTHESES} are used, "
                  f"as the service reads them")
        for line in malformed[:SHOWN_MALFORMED]:
            print(f"  malformed: {line}")
        if len(malformed) > SHOWN_MALFORMED:
            print(f"  ... and {len(malformed) - SHOWN_MALFORMED} more malformed rows")
        items += kept
        record.append({"file": path.name, "sha256": sha256(path), "rows": len(kept), "malformed": len(malformed)})
    return items, record


def nbests(items: list[Labelled]) -> list[NBest]:
    return [NBest(it.nbest.sentences[:MAX_HYPOTHESES], it.nbest.phonemes[:MAX_HYPOTHESES]) for it in items]
