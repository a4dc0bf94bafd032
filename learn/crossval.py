"""Cross-validate `learn.adapt` on one labelled file: `python -m learn.crossval --data FILE --out DIR [--folds 5]`.

A team with one labelled file has no other held-out lists: this cuts the file's rows in `--folds` folds by a seeded
sha256 of their ids, and for each fold adapts on the other folds (`python -m learn.adapt`, in a subprocess, its log
kept) and scores the adapted folder on the fold it never saw, beside TOP1, the shipped model and the rule memo
(`learn.memo_baseline`, learned from the same other folds). With `--limits`, each fold's lists are also asked what
limits the adapted model (`learn.limits`: are the truth's edits among its candidates at all, kept out by the trust
floor, or ranked wrong).

Writes under `--out`: `foldK/train.jsonl`, `foldK/test.jsonl`, `foldK/adapted/` (the folder `learn.adapt` wrote),
`foldK/adapt.log`, and `crossval.json` and `crossval.md` (a table per fold and pooled over folds: the fold's
characters summed, not the folds' rates averaged). Every model answers as the service would: a TOP1 longer than
`max_top1_chars` is answered TOP1. `--reuse` keeps a fold's adapted folder that is already there
(to score it again, or with `--limits`), and `--adapt-arg` passes flags to `learn.adapt` (`--adapt-arg=--epochs=0`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from config import Config
from learn.adapt_data import nbests
from learn.data.labelled import Labelled, read_labelled_lenient, write_labelled
from learn.evaluate import cer_score, served_answers
from learn.memo_baseline import MEMO_MARGINS, RuleMemo
from model.corrector import Corrector
from model.weights_meta import CONFIG_FILE
from preprocess.text import han_chars, strip_spaces, top1_answer

FOLDS = 5
SEED = 0


def fold_of(item_id: str, seed: int, folds: int) -> int:
    """The fold a row falls in: a seeded sha256 of its id (stable across runs and file orders)."""
    return int.from_bytes(hashlib.sha256(f"crossval:{seed}:{item_id}".encode()).digest()[:8], "big") % folds


def write_folds(items: list[Labelled], out: Path, folds: int, seed: int) -> list[Path]:
    """Write each fold's train (the other folds) and test files; return the folds' folders."""
    where = [fold_of(it.id, seed, folds) for it in items]
    dirs = []
    for k in range(folds):
        d = out / f"fold{k}"
        d.mkdir(parents=True, exist_ok=True)
        write_labelled([it for it, f in zip(items, where, strict=True) if f != k], d / "train.jsonl")
        write_labelled([it for it, f in zip(items, where, strict=True) if f == k], d / "test.jsonl")
        dirs.append(d)
    return dirs


def adapt_fold(fold: Path, adapt_args: list[str], reuse: bool) -> float:
    """Run `learn.adapt` on the fold's train file into `fold/adapted` (log in `fold/adapt.log`); its wall time."""
    folder = fold / "adapted"
    if reuse and (folder / CONFIG_FILE).is_file():
        return 0.0
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "learn.adapt", "--data", str(fold / "train.jsonl"), "--out", str(folder), *adapt_args]
    with (fold / "adapt.log").open("w", encoding="utf-8") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"learn.adapt failed on {fold} (exit {done.returncode}): see {fold / 'adapt.log'}")
    return time.monotonic() - t0


def score_fold(fold: Path, limits: bool, mlm_dir: Path | None = None) -> dict[str, Any]:
    """Score TOP1, the shipped model, the adapted one (with `mlm_dir`'s masked LM, where it weighs one) and the rule
    memo on the fold's test file."""
    train = read_labelled_lenient(fold / "train.jsonl").items
    test = read_labelled_lenient(fold / "test.jsonl").items
    lists, truths = nbests(test), [han_chars(it.truth) for it in test]
    figures: dict[str, Any] = {}
    longest = Config().max_top1_chars
    shipped = Corrector(device="cpu")
    shipped.setup()
    adapted = Corrector(fold / "adapted", device="cpu", masked_lm_dir=mlm_dir)
    adapted.setup()
    for name, corrector in (("shipped", shipped), ("adapted", adapted)):
        figures[name] = asdict(cer_score(lists, truths, served_answers(corrector, lists, longest)))
    assert shipped.lm is not None
    pairs = [(han_chars(it.nbest.top1), han_chars(it.truth)) for it in train]
    for margin in MEMO_MARGINS:
        memo = RuleMemo.learn(pairs, shipped.lm, margin)
        said = [top1_answer(nb.sentences) if len(strip_spaces(nb.top1)) > longest else memo.answer(nb.top1)
                for nb in lists]
        figures[f"memo (margin {margin:g})"] = asdict(cer_score(lists, truths, said))
    out: dict[str, Any] = {"lists": len(test), "chars": sum(map(len, truths)), "models": figures}
    if limits:
        from learn.limits import limits_of

        out["limits"] = limits_of(adapted, lists, truths, pairs, longest)
    return out


def pooled(folds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each model's figures over every fold's lists together (errors and characters summed)."""
    chars = sum(f["chars"] for f in folds)
    out: dict[str, dict[str, float]] = {}
    for name in folds[0]["models"]:
        rows = [f["models"][name] | {"chars": f["chars"]} for f in folds]
        top1 = sum(r["top1_cer"] * r["chars"] for r in rows) / chars
        answer = sum(r["answer_cer"] * r["chars"] for r in rows) / chars
        summed = {k: sum(r[k] for r in rows) for k in ("sentences", "made_better", "made_worse", "top1_right",
                                                        "top1_right_changed")}
        out[name] = summed | {"top1_cer": top1, "answer_cer": answer}
    return out


def row(label: str, m: dict[str, float]) -> str:
    change = (m["answer_cer"] - m["top1_cer"]) / max(m["top1_cer"], 1e-9)
    return (f"| {label} | {m['sentences']} | {m['top1_cer']:.2%} | {m['answer_cer']:.2%} | {change:+.1%} | "
            f"{m['made_better']} | {m['made_worse']} ({m['made_worse'] / max(1, m['sentences']):.2%}) | "
            f"{m['top1_right_changed']} of {m['top1_right']} "
            f"({m['top1_right_changed'] / max(1, m['top1_right']):.2%}) |")


def markdown(folds: list[dict[str, Any]], total: dict[str, dict[str, float]]) -> str:
    lines = []
    for name in total:
        lines += [f"\n### {name}\n", "| fold | lists | TOP1 CER | answer CER | change vs TOP1 | better | worse | "
                  "right TOP1s changed |", "|---|---|---|---|---|---|---|---|"]
        lines += [row(str(k), f["models"][name]) for k, f in enumerate(folds)]
        lines.append(row("**all**", total[name]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Cross-validate learn.adapt on one labelled file.")
    ap.add_argument("--data", type=Path, required=True, help="the labelled file (JSON list or JSONL)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the folds' files, folders and tables")
    ap.add_argument("--folds", type=int, default=FOLDS)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--only", type=int, action="append", help="run only these folds (repeatable)")
    ap.add_argument("--reuse", action="store_true", help="keep a fold's adapted folder already written")
    ap.add_argument("--limits", action="store_true", help="also diagnose what limits the adapted model (learn.limits)")
    ap.add_argument("--adapt-arg", action="append", default=[], help="a flag passed on to learn.adapt")
    ap.add_argument("--mlm-dir", type=Path, help="a masked-LM folder (MLM_DIR): each fold adapted with it (learn.adapt "
                    "--mlm-dir) and its folder scored with it")
    args = ap.parse_args(argv)
    if args.folds < 2:
        ap.error(f"--folds must be at least 2, got {args.folds}")
    items = read_labelled_lenient(args.data).items
    dirs = write_folds(items, args.out, args.folds, args.seed)
    results = []
    for k, fold in enumerate(dirs):
        if args.only and k not in args.only:
            continue
        adapt_args = [*args.adapt_arg, *(["--mlm-dir", str(args.mlm_dir)] if args.mlm_dir else [])]
        wall = adapt_fold(fold, adapt_args, args.reuse)
        result = score_fold(fold, args.limits, args.mlm_dir) | {"fold": k, "adapt_wall_s": round(wall, 1)}
        (fold / "scores.json").write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
        m = result["models"]["adapted"]
        print(f"fold {k}: {result['lists']} lists, TOP1 {m['top1_cer']:.2%} -> adapted {m['answer_cer']:.2%}, "
              f"{m['made_better']} better, {m['made_worse']} worse, {m['top1_right_changed']} right TOP1s changed "
              f"(adapt {wall:.0f} s)", flush=True)
        results.append(result)
    total = pooled(results)
    report = {"data": str(args.data), "folds": args.folds, "seed": args.seed, "adapt_args": args.adapt_arg,
              "mlm_dir": str(args.mlm_dir) if args.mlm_dir else None,
              "per_fold": results, "pooled": total}
    (args.out / "crossval.json").write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    text = f"## cross-validated, {args.folds} folds (seed {args.seed}), {len(items)} lists\n" + markdown(results, total)
    (args.out / "crossval.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
