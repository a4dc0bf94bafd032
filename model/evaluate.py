"""Evaluate the shipped corrector: `python -m model.evaluate [--json] [--write]`.

Two evaluation sets, both simulated with fixed seeds:
- `test`: the news test split (documents never trained on), default recogniser;
- `reviews`: product-review text (never trained on), the REVIEWS recogniser with other error rates
  and another mix of errors.
For each: TOP1 CER, model CER, n-best oracle CER, relative reduction, sentences made better / worse,
sentences whose TOP1 was right and got changed, and the corrector's time per batch of 64 and of 1.
`--write` stores the figures in the weights' config.json so `GET /` can show them.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from pathlib import Path

from rapidfuzz.distance import Levenshtein

from model.corrector import WEIGHTS_DIR, Corrector, timed
from preprocess.simulate import DEFAULT, REVIEWS, SimConfig, load_simulator
from preprocess.text import strip_spaces

SETS: dict[str, tuple[str, SimConfig, int]] = {"test": ("test", DEFAULT, 11), "reviews": ("reviews", REVIEWS, 12)}


def eval_set(corrector: Corrector, corpus: Path, name: str, limit: int) -> dict:
    """Simulate one evaluation set and score the corrector on it."""
    split, sim_cfg, seed = SETS[name]
    sim = load_simulator(corpus, sim_cfg)
    rng = random.Random(seed)
    sents = [s for s in (corpus / f"{split}.txt").read_text(encoding="utf-8").split("\n") if s][:limit]
    truths = [strip_spaces(s) for s in sents]
    nbests = [sim.simulate(s, rng, phones=True) for s in sents]
    answers: list[str] = []
    for i in range(0, len(nbests), 64):
        answers += corrector.predict_batch(nbests[i : i + 64])
    total = sum(map(len, truths))
    top1_e = model_e = oracle_e = better = worse = right_changed = top1_right = 0
    for nb, ans, ref in zip(nbests, answers, truths, strict=True):
        hyps = [strip_spaces(h) for h in nb.sentences]
        t1 = Levenshtein.distance(hyps[0], ref)
        m = Levenshtein.distance(ans, ref)
        top1_e += t1
        model_e += m
        oracle_e += min(Levenshtein.distance(h, ref) for h in hyps)
        better += m < t1
        worse += m > t1
        top1_right += t1 == 0
        right_changed += t1 == 0 and ans != hyps[0]
    n = len(sents)
    batch64 = nbests[:64]
    return {
        "sentences": n,
        "top1_cer": top1_e / total,
        "model_cer": model_e / total,
        "oracle_cer": oracle_e / total,
        "relative_reduction": (top1_e - model_e) / max(top1_e, 1),
        "made_better": better,
        "made_worse": worse,
        "made_worse_share": worse / n,
        "top1_right": top1_right,
        "top1_right_changed": right_changed,
        "top1_right_changed_share": right_changed / max(top1_right, 1),
        "ms_per_batch_64": 1000 * timed(corrector.predict_batch, batch64),
        "ms_per_batch_1": 1000 * timed(corrector.predict_batch, batch64[:1], repeat=20),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="Evaluate the corrector on both evaluation sets.")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--weights", type=Path, default=WEIGHTS_DIR)
    ap.add_argument("--limit", type=int, default=3000, help="sentences per set")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--write", action="store_true", help="store the figures in the weights' config.json")
    args = ap.parse_args()
    if not (args.corpus / "test.txt").exists():
        from preprocess.corpus import build, write

        write(build(), args.corpus)
    corrector = Corrector(args.weights, device=args.device)
    corrector.setup()
    results = {name: eval_set(corrector, args.corpus, name, args.limit) for name in SETS}
    results["machine"] = f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores"
    if args.write:
        cfg_path = args.weights / "config.json"
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
        meta["evaluation"] = results
        cfg_path.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(results, indent=1))
        return
    rows = [
        ("sentences", "{:d}"), ("top1_cer", "{:.2%}"), ("model_cer", "{:.2%}"), ("oracle_cer", "{:.2%}"),
        ("relative_reduction", "{:.1%}"), ("made_better", "{:d}"), ("made_worse", "{:d}"),
        ("made_worse_share", "{:.2%}"), ("top1_right", "{:d}"), ("top1_right_changed", "{:d}"),
        ("top1_right_changed_share", "{:.2%}"), ("ms_per_batch_64", "{:.1f}"), ("ms_per_batch_1", "{:.1f}"),
    ]  # fmt: skip
    print(f"| metric | {' | '.join(SETS)} |\n|---|" + "---|" * len(SETS))
    for key, fmt in rows:
        print(f"| {key} | " + " | ".join(fmt.format(results[s][key]) for s in SETS) + " |")
    print(f"machine: {results['machine']}")


if __name__ == "__main__":
    main()
