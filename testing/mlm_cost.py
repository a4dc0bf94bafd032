"""What a team's masked LM (`MLM_DIR`, model/masked_lm.py) costs a batch:
`python -m testing.mlm_cost --mlm-dir DIR [--weights FOLDER] [--device cpu] [--out docs/bench/issue59]`.

Times `predict_batch` on batches of 64 simulated lists (the `test`, `reviews` and `decoded` sets interleaved, as
`testing.ab --mode time` builds them, after `make corpus`; else the corrector's warm-up lists) with the masked LM
asked, and the same corrector with it left out (its feature 0), alternating batch by batch so that both see the same
machine; and the masked LM's own call
(`Reranker.mlm_gains`) with the rows it ran. `--weights` is a folder whose stage weighs the masked LM (one `make adapt
... MLM_DIR=DIR` wrote); without it, a temporary copy of the shipped folder whose stage weighs it by 1 (what it costs,
not what it answers). Prints a table; writes `mlm_cost.json` and `mlm_cost.png` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from testing.report import machine_info

REPO_ROOT = Path(__file__).resolve().parent.parent
SETS = ("test", "reviews", "decoded")


def weighing_copy(mlm_dir: Path, folder: Path, weight: float = 1.0) -> Path:
    """The shipped folder copied into `folder` (new), its full stage weighing the masked LM in `mlm_dir` by `weight`
    and recording it as `make adapt ... MLM_DIR=` does; return `folder`."""
    from config import DEFAULT_WEIGHTS_DIR
    from learn.adapt_folder import masked_lm_record
    from model.weights_meta import RerankStage, WeightsMeta

    shutil.copytree(DEFAULT_WEIGHTS_DIR, folder)
    meta = WeightsMeta.load(folder)
    full = meta.rerank["full"]
    meta = meta.with_stage("full", RerankStage({**full.weights, "mlm": weight}, full.dev, full.gate))
    meta.replace(masked_lm=masked_lm_record(mlm_dir)).save(folder)
    return folder


def lists(limit: int, corrector: object) -> list:
    """The simulated sets' lists, interleaved; where `make corpus` was not run (a GPU machine without a network), the
    corrector's own warm-up lists (frequent Taiwan words, three hypotheses a list), repeated."""
    import random

    from learn.evaluate import simulated_set

    if not (REPO_ROOT / "data" / "corpus" / "test.txt").is_file():
        warm = corrector._warm_up_lists()
        return (warm * (1 + len(SETS) * limit // len(warm)))[: len(SETS) * limit]
    out = []
    for name in SETS:
        out += simulated_set(REPO_ROOT / "data" / "corpus", name, limit).nbests
    random.Random(21).shuffle(out)
    return out


def measure(weights: Path, mlm_dir: Path, device: str, batches: int, threads: int) -> dict:
    import torch

    from model.corrector import Corrector

    if threads:
        torch.set_num_threads(threads)
    corrector = Corrector(weights, device=device, masked_lm_dir=mlm_dir)
    corrector.setup()
    reranker = corrector.reranker
    assert reranker is not None and reranker.masked_lm is not None  # the folder weighs it: setup loaded it
    masked_lm = reranker.masked_lm
    items = lists(64 * (batches + 4) // len(SETS) + 1, corrector)
    times: dict[str, list[float]] = {"with": [], "without": [], "mlm_call": []}
    rows: list[int] = []
    for k in range(batches + 4):
        batch = items[64 * k : 64 * (k + 1)]
        for side in ("with", "without"):
            reranker.masked_lm = masked_lm if side == "with" else None
            t = time.perf_counter()
            corrector.predict_batch(batch)
            if k >= 4:  # the first batches warm caches up
                times[side].append(1000 * (time.perf_counter() - t))
        reranker.masked_lm = masked_lm
        featurized = corrector.batch(batch)
        probs = corrector.predict(featurized)
        examples = [e for e in featurized.examples if e is not None]
        cands = [reranker.candidates(e, probs[i]) for i, e in enumerate(featurized.examples) if e is not None]
        calls = []
        real_forward = masked_lm.model.forward

        def counting(*args, _calls=calls, _forward=real_forward, **kwargs):
            _calls.append(int(kwargs["input_ids"].shape[0]))
            return _forward(*args, **kwargs)

        masked_lm.model.forward = counting
        t = time.perf_counter()
        reranker.mlm_gains(examples, cands)
        if k >= 4:
            times["mlm_call"].append(1000 * (time.perf_counter() - t))
            rows.append(sum(calls))
        del masked_lm.model.forward
    return {"median_ms_64_with": statistics.median(times["with"]),
            "median_ms_64_without": statistics.median(times["without"]),
            "median_ms_mlm_call": statistics.median(times["mlm_call"]),
            "median_rows_per_batch": statistics.median(rows), "batches": batches, "raw_ms": times,
            "masked_lm": masked_lm.describe(), "threads": torch.get_num_threads(), "device": device}


def plot(result: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    raw = result["raw_ms"]
    ax.boxplot([raw["without"], raw["with"], raw["mlm_call"]])
    ax.set_xticks([1, 2, 3], ["without", "with the masked LM", "the masked LM's call"])
    ax.set_ylabel("ms per batch of 64")
    ax.set_title(f"{Path(result['masked_lm']['path']).name} on {result['device']}")
    fig.tight_layout()
    path = out / "mlm_cost.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mlm-dir", type=Path, required=True)
    ap.add_argument("--weights", type=Path, help="a folder whose stage weighs the masked LM (default: a shipped copy)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("out/mlm_cost"))
    args = ap.parse_args(argv)
    from model.masked_lm import MaskedLMError

    with tempfile.TemporaryDirectory() as tmp:
        try:
            weights = args.weights or weighing_copy(args.mlm_dir, Path(tmp) / "weighs_mlm")
            result = measure(weights, args.mlm_dir, args.device, args.batches, args.threads)
        except MaskedLMError as e:
            print(f"mlm_cost: {e}", file=sys.stderr)
            return 2
    result |= {"machine": machine_info(), "command": " ".join(["python -m testing.mlm_cost", *(argv or sys.argv[1:])])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mlm_cost.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    image = plot(result, args.out)
    print(f"| {result['masked_lm']['path']} ({result['masked_lm']['parameters']:,} parameters), {args.device}, "
          f"{result['threads']} threads | ms per batch of 64 (median of {args.batches}) |\n|---|---:|\n"
          f"| without the masked LM | {result['median_ms_64_without']:.1f} |\n"
          f"| with it | {result['median_ms_64_with']:.1f} |\n"
          f"| its own call ({result['median_rows_per_batch']:.0f} masked sentences a batch) | "
          f"{result['median_ms_mlm_call']:.1f} |")
    print(f"machine: {result['machine']['cpu_model']}, {result['machine']['logical_cpus']} CPUs; wrote "
          f"{args.out / 'mlm_cost.json'}, {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
