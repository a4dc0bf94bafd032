"""How a file's n-best lists are shaped (issue 60): how far the lower hypotheses stray from TOP1, and where the
truth is when TOP1 is wrong.

`python -m learn.list_shape FILE [FILE ...] [--sets test,decoded] [--json OUT]` prints one row per file (or
simulated set of `learn.evaluate`). A file is a labelled file (the competition's keys) or a file of requests
(`sentence_list` without a truth: the truth columns stay empty).
Measures, on Han characters only, each lower hypothesis aligned to TOP1 (`preprocess.align`):

- `differ`: the share of TOP1's positions a lower hypothesis writes otherwise, the mean over lower hypotheses and
  then over lists (a real recogniser's: 15-18 %);
- `any differ`: the share of TOP1's positions where any lower hypothesis differs (what the stand-ins before issue 60
  were told apart by: 71-81 % there);
- `spans`: the runs of adjacent differing positions in a lower hypothesis, the mean, and the share of lower
  hypotheses with at most two;
- `places`: distinct differing positions over the whole list, over the mean `differ` count (about 1 where every
  lower hypothesis varies the same stretch, high where each strays somewhere of its own);
- `truth listed`: among lists whose TOP1 is wrong, the share whose truth is a lower hypothesis, and its rank's
  quartiles.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from preprocess.align import align_to
from preprocess.text import han_chars


@dataclass(frozen=True)
class Shape:
    """The shape of one file's lists (see the module docstring)."""

    name: str
    lists: int
    hypotheses: float
    differ: float
    any_differ: float
    spans: float
    at_most_two_spans: float
    places: float
    wrong_top1: int | None
    truth_listed: float | None
    truth_rank_quartiles: tuple[float, float, float] | None


def differing(top1: str, hyp: str) -> list[int]:
    """TOP1's positions that `hyp` writes otherwise."""
    return [i for i, seg in enumerate(align_to(top1, hyp)) if seg != top1[i]]


def runs(positions: list[int]) -> int:
    """How many runs of adjacent positions a sorted list of positions holds."""
    return sum(1 for k, p in enumerate(positions) if k == 0 or positions[k - 1] != p - 1)


def read_rows(path: Path) -> list[tuple[list[str], str | None]]:
    """Each row's hypotheses (Han characters only) and its truth (None in a request file)."""
    text = path.read_text(encoding="utf-8-sig")
    rows = json.loads(text) if text.lstrip()[:1] == "[" else [json.loads(line) for line in text.split("\n")
                                                              if line.strip()]
    out = []
    for row in rows:
        truth = row.get("ground_truth_sentence")
        hyps = [han_chars(s) for s in row["sentence_list"]]
        out.append((hyps, None if truth is None else han_chars(truth)))
    return out


def simulated_rows(corpus: Path, name: str, limit: int) -> list[tuple[list[str], str | None]]:
    """One of `learn.evaluate`'s simulated sets, as `read_rows` gives a file."""
    from learn.evaluate import simulated_set  # the simulators load the corpus: only when a set is asked for

    got = simulated_set(corpus, name, limit)
    return [([han_chars(s) for s in nb.sentences], han_chars(t)) for nb, t in zip(got.nbests, got.truths, strict=True)]


def shape(name: str, rows: list[tuple[list[str], str | None]]) -> Shape:
    """Measure a file's lists."""
    differ, any_differ, spans, two, places, ranks = [], [], [], [], [], []
    hyps_per_list, wrong = [], 0
    labelled = all(truth is not None for _, truth in rows)
    for hyps, truth in rows:
        top1, lower = hyps[0], hyps[1:]
        hyps_per_list.append(len(hyps))
        if labelled and truth != top1:
            wrong += 1
            if truth in lower:
                ranks.append(lower.index(truth) + 2)
        if not top1 or not lower:
            continue
        sets = [differing(top1, h) for h in lower]
        differ.append(statistics.fmean(len(s) / len(top1) for s in sets))
        union = set().union(*sets)
        any_differ.append(len(union) / len(top1))
        counts = [runs(s) for s in sets if s]
        if counts:
            spans.append(statistics.fmean(counts))
            two.append(sum(c <= 2 for c in counts) / len(counts))
            places.append(len(union) / statistics.fmean(len(s) for s in sets if s))

    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    quartiles = None
    if len(ranks) >= 2:
        q = statistics.quantiles(ranks, n=4, method="inclusive")
        quartiles = (q[0], q[1], q[2])
    elif ranks:
        quartiles = (float(ranks[0]),) * 3
    return Shape(name, len(rows), mean(hyps_per_list), mean(differ), mean(any_differ), mean(spans), mean(two),
                 mean(places), wrong if labelled else None,
                 (len(ranks) / wrong if wrong else 0.0) if labelled else None, quartiles)


def table(shapes: list[Shape]) -> str:
    """The printed table, one row per file."""
    head = ("file", "lists", "hyps", "differ", "any differ", "spans", "<=2 spans", "places", "wrong TOP1",
            "truth listed", "its rank (quartiles)")
    rows = [head]
    for s in shapes:
        rank = "" if s.truth_rank_quartiles is None else " / ".join(f"{q:g}" for q in s.truth_rank_quartiles)
        rows.append((s.name, f"{s.lists:,}", f"{s.hypotheses:.1f}", f"{100 * s.differ:.1f} %",
                     f"{100 * s.any_differ:.1f} %", f"{s.spans:.2f}", f"{100 * s.at_most_two_spans:.0f} %",
                     f"{s.places:.2f}", "" if s.wrong_top1 is None else f"{s.wrong_top1:,}",
                     "" if s.truth_listed is None else f"{100 * s.truth_listed:.0f} %", rank))
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description="Print how a file's n-best lists are shaped: how far the lower "
                                             "hypotheses stray from TOP1, and where the truth is.")
    ap.add_argument("files", nargs="*", type=Path, help="labelled files or request files (JSON list or JSONL)")
    ap.add_argument("--sets", default="", help="simulated sets of learn.evaluate too, comma-separated (test,decoded)")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="the corpus the simulated sets read")
    ap.add_argument("--limit", type=int, help="the first N lists of each file")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    shapes = []
    for path in args.files:
        try:
            rows = read_rows(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            ap.exit(2, f"list_shape: {path}: cannot be read as lists ({type(e).__name__}: {e})\n")
        shapes.append(shape(str(path), rows[: args.limit]))
    for name in filter(None, args.sets.split(",")):
        shapes.append(shape(f"simulated {name}", simulated_rows(args.corpus, name, args.limit or 3000)))
    if not shapes:
        ap.error("name a file or a simulated set")
    print(table(shapes))
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps([asdict(s) for s in shapes], ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
