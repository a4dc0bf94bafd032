"""Where a batch of 64 spends its time: the corrector's three hooks (batch, predict, unbatch), timed apart."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from config import CPU_PRECISIONS, CPU_RUNTIMES
from testing import cli
from testing.report import table, write_json
from testing.samples import request_bodies

HOOKS = ("batch", "predict", "unbatch")


def profile(device: str, rounds: int, size: int, threads: int, runtime: str = "torch", precision: str = "int8") -> dict:
    """Time each hook of `rounds` batches of `size` different real-shaped lists; medians in ms, shares of the sum."""
    import torch

    from model.corrector import Corrector
    from preprocess.text import NBest

    corrector = Corrector(device=device, threads=threads, cpu_runtime=runtime, cpu_precision=precision)
    corrector.setup()
    bodies = request_bodies(size * rounds, seed=1)
    lists = [NBest(tuple(b["sentence_list"]), tuple(b.get("phoneme_sequence_list") or ())) for b in bodies]
    times: dict[str, list[float]] = {hook: [] for hook in HOOKS}
    for r in range(rounds):
        items = lists[r * size : (r + 1) * size]
        t0 = time.perf_counter()
        batch = corrector.batch(items)
        t1 = time.perf_counter()
        probs = corrector.predict(batch)
        if corrector.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        corrector.unbatch(items, batch, probs)
        t3 = time.perf_counter()
        for hook, seconds in zip(HOOKS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[hook].append(seconds * 1000)
    medians = {hook: statistics.median(ms) for hook, ms in times.items()}
    total = sum(medians.values())
    return {"device": str(corrector.device), "precision": corrector.precision, "runtime": corrector.runtime,
            "batch_size": size, "rounds": rounds,
            "torch_threads": torch.get_num_threads(), "median_ms": medians, "total_ms": total,
            "share": {hook: ms / total for hook, ms in medians.items()}, "machine": platform.processor() or
            platform.machine(), "cores": os.cpu_count(), "gpu": torch.cuda.get_device_name(0)
            if corrector.device.type == "cuda" else None}


def hooks_table(results: list[dict]) -> list[str]:
    """One row a profile (`profile`'s figures): each hook's median ms, their sum and the network's share."""
    return table("device | batch | predict (the network) | unbatch | total | network's share",
                 [[f"{r['device']} {r['precision']} ({r['runtime']})", *(f"{r['median_ms'][h]:.1f}" for h in HOOKS),
                   f"{r['total_ms']:.1f}", f"{100 * r['share']['predict']:.0f} %"] for r in results])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testing.batch_profile", description=__doc__)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: its default)")
    ap.add_argument("--runtime", choices=CPU_RUNTIMES, default="torch", help="the network on CPU (CPU_RUNTIME)")
    ap.add_argument("--precision", choices=CPU_PRECISIONS, default="int8", help="on CPU (CPU_PRECISION)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    result = profile(args.device, args.rounds, args.size, args.threads, args.runtime, args.precision)
    print(f"{result['torch_threads']} torch threads, batches of {result['batch_size']}, median of {result['rounds']}:")
    print("\n".join(hooks_table([result])))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.batch_profile")
