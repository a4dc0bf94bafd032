"""Which signal tells the better sentence, per set: `python -m learn.diagnose [--data FILE] [--sets ...]`.

The second stage (`model.rerank`) can only be as good as its features. For every list of a set this builds the
second stage's candidates and their features, then asks each feature alone two questions:
- on lists where some candidate has fewer errors than TOP1: does the feature prefer the best candidate to TOP1
  (`prefers_better`), or is it blind to the difference (`blind`)?
- on lists whose TOP1 is right: how often does it prefer a wrong candidate to TOP1 (`prefers_wrong`)?
A feature that prefers the better sentence far more often than a wrong one is worth its weight; one near
chance on a set is why the second stage cannot close that set's gap. Also printed: TOP1 CER and the CER of
the best candidate of each list (what a perfect second stage would reach).

Run it on the competition's labelled file (`--data FILE`) to see which signals carry over to real lists before
refitting the weights on it in a copy of the shipped ones (`python -m learn.tune --weights COPY --data FILE --write`;
the command it ends with says how).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from config import DEFAULT_WEIGHTS_DIR
from learn.evaluate import SIM_SETS, LabelledSet, file_set, simulated_set
from learn.tune import DevList, dev_lists
from model.corrector import Corrector
from model.rerank import Features

TUNED_COPY = "adapted/tuned"  # where the suggested refit copies the shipped weights (adapted/: git- and docker-ignored)


@dataclass(frozen=True)
class Signal:
    """How one feature alone orders candidates against TOP1 on one set (shares of the lists asked)."""

    prefers_better: float
    blind: float
    prefers_wrong: float


@dataclass(frozen=True)
class SetDiagnosis:
    lists: int
    fixable_lists: int  # lists where some candidate has fewer errors than TOP1
    top1_right_lists: int
    top1_cer: float
    best_candidate_cer: float
    signals: dict[str, Signal]


def diagnose(lists: list[DevList]) -> SetDiagnosis:
    """Ask each feature of `Features` alone which candidate it prefers (a larger feature is preferred)."""
    names = Features.names()
    fixable = [d for d in lists if d.errors.min() < d.errors[0]]
    right = [d for d in lists if d.errors[0] == 0 and len(d.errors) > 1]
    # best candidate minus TOP1, per fixable list; every wrong candidate minus TOP1, over right lists
    better = np.array([d.feats[int(np.argmin(d.errors))] - d.feats[0] for d in fixable]).reshape(-1, len(names))
    wrong = np.concatenate([d.feats[1:][d.errors[1:] > 0] - d.feats[0] for d in right] or [np.zeros((0, len(names)))])
    signals = {}
    for j, name in enumerate(names):
        col = better[:, j]
        signals[name] = Signal(
            prefers_better=float(np.mean(col > 0)) if len(col) else 0.0,
            blind=float(np.mean(col == 0)) if len(col) else 0.0,
            prefers_wrong=float(np.mean(wrong[:, j] > 0)) if len(wrong) else 0.0,
        )
    chars = max(1, sum(d.truth_len for d in lists))
    return SetDiagnosis(
        lists=len(lists),
        fixable_lists=len(fixable),
        top1_right_lists=len(right),
        top1_cer=sum(int(d.errors[0]) for d in lists) / chars,
        best_candidate_cer=sum(int(d.errors.min()) for d in lists) / chars,
        signals=signals,
    )


def table(name: str, result: SetDiagnosis) -> str:
    """Render one set's diagnosis as a markdown table."""
    lines = [
        f"### {name}: {result.lists} lists, {result.fixable_lists} with a better candidate; TOP1 CER "
        f"{result.top1_cer:.2%}, best candidate CER {result.best_candidate_cer:.2%}",
        "",
        "| feature | prefers the better sentence | blind to it | prefers a wrong one to a right TOP1 |",
        "|---|---|---|---|",
    ]
    for feature, s in result.signals.items():
        lines.append(f"| {feature} | {s.prefers_better:.1%} | {s.blind:.1%} | {s.prefers_wrong:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Tell which second-stage feature prefers the better sentence.")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS_DIR)
    ap.add_argument("--data", type=Path, action="append", default=[], help="labelled file(s) to diagnose")
    ap.add_argument("--sets", default=None, help=f"simulated sets (default {','.join(SIM_SETS)}; none with --data)")
    ap.add_argument("--limit", type=int, default=None, help="lists per set (default 3,000; all of a --data file)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = ap.parse_args(argv)
    names = [s for s in (args.sets if args.sets is not None else ("" if args.data else ",".join(SIM_SETS)))
             .split(",") if s]
    try:
        if names and not (args.corpus / "test.txt").exists():
            from learn.data.corpus import build, write

            write(build(), args.corpus)
        sets: list[LabelledSet] = [simulated_set(args.corpus, n, args.limit or 3000) for n in names]
        sets += [file_set(p, args.limit or 0) for p in args.data]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    corrector = Corrector(args.weights, device="cpu")
    corrector.setup()
    results = {s.name: diagnose(dev_lists(corrector, s.nbests, s.truths, use_net=True,
                                          adaptation=corrector.adaptation)) for s in sets}
    if args.json:
        print(json.dumps({k: asdict(v) for k, v in results.items()}, indent=1))
    else:
        print("\n\n".join(table(k, v) for k, v in results.items()))
        print(f"\nnext: {next_command(args.data, args.weights)}")
    return 0


def next_command(data: list[Path], weights: Path = DEFAULT_WEIGHTS_DIR) -> str:
    """Name what to run once the signals are known: refit the second stage on what was diagnosed, in a folder of the
    user's (a copy of the shipped weights, never over them)."""
    copy = ""
    if weights == DEFAULT_WEIGHTS_DIR:
        copy, weights = f"mkdir -p adapted && cp -r model/weights {TUNED_COPY} && ", Path(TUNED_COPY)
    where = f"--weights {shlex.quote(str(weights))}"
    if not data:
        return (f"{copy}.venv/bin/python -m learn.tune {where} --variant full --write refits the second stage's "
                f"weights in {weights}")
    files = " ".join(f"--data {shlex.quote(str(p))}" for p in data)
    names = " ".join(shlex.quote(str(p)) for p in data)
    return (f"{copy}.venv/bin/python -m learn.tune {where} {files} --write refits the second stage's weights on it "
            f"in {weights}, or make adapt DATA=\"{names}\" OUT=adapted/NAME adapts the whole model to it")


if __name__ == "__main__":
    sys.exit(main())
