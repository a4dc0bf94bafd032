"""What an adapted folder learned: `python -m learn.explain --weights DIR [--data FILE] [--shown N]`.

Prints the folder's most trusted confusion rules (source → target, count / seen in the lists it was learned from,
the out-of-fold counts, the trust, and whether it reaches the trust floor the folder serves), and, for a labelled file,
a sample of the lists the served model changed for the better, made worse, and left wrong, each with TOP1, the answer
and the truth. (`learn.adapt` prints the same rules table when it finishes.)
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from rapidfuzz.distance import Levenshtein

from config import Config
from learn.adapt import trusted_rules
from learn.adapt_data import nbests
from learn.data.labelled import read_labelled
from learn.evaluate import served_answers
from model.corrector import Corrector
from preprocess.text import han_chars


def explain_lists(corrector: Corrector, data: Path, shown: int, seed: int = 0) -> str:
    """A sample of the file's lists the model made better, made worse and left wrong."""
    items = read_labelled(data)
    lists = nbests(items)
    said = served_answers(corrector, lists, Config().max_top1_chars)  # as the service answers them
    groups: dict[str, list[tuple[str, str, str]]] = {"made better": [], "made worse": [], "left wrong": []}
    for it, answer in zip(items, said, strict=True):
        top1, truth = han_chars(it.nbest.top1), han_chars(it.truth)
        before, after = Levenshtein.distance(top1, truth), Levenshtein.distance(answer, truth)
        if after < before:
            groups["made better"].append((top1, answer, truth))
        elif after > before:
            groups["made worse"].append((top1, answer, truth))
        elif after > 0:
            groups["left wrong"].append((top1, answer, truth))
    rng = random.Random(seed)
    lines = [f"\n## {len(items)} lists of {data.name}: {', '.join(f'{len(v)} {k}' for k, v in groups.items())}"]
    for name, rows in groups.items():
        lines += ["", f"### {name} (a sample of {min(shown, len(rows))})", "", "| TOP1 | answer | truth |",
                  "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rng.sample(rows, min(shown, len(rows)))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Show what an adapted weights folder learned.")
    ap.add_argument("--weights", type=Path, required=True, help="an adapted weights folder (learn.adapt --out)")
    ap.add_argument("--data", type=Path, help="a labelled file: sample the lists changed, made worse, left wrong")
    ap.add_argument("--shown", type=int, default=20, help="rules shown, and lists shown per group")
    args = ap.parse_args(argv)
    corrector = Corrector(args.weights, device="cpu")
    corrector.setup()
    if corrector.adaptation is None:
        print(f"explain: {args.weights} is not an adapted folder (no confusions to show)", file=sys.stderr)
        return 2
    print(trusted_rules(corrector.adaptation.confusions, args.shown))
    if args.data is not None:
        print(explain_lists(corrector, args.data, args.shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
