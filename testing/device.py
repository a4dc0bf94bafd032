"""The benchmark's sections that time the model on a device (`testing.bench --sections gpu,hooks`): the GPU check,
served with each DEVICE in turn (`bash testing/gpu_check.sh` runs it), and where a batch of 64 spends its time, the
corrector's hooks timed apart."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from argparse import Namespace
from typing import Any

from config import Config
from preprocess.text import NBest
from testing import cli, report
from testing.load import payload_templates
from testing.report import measure_closed
from testing.samples import request_bodies
from testing.server import sampling

GPU_CLIENTS = (64, 256)  # the GPU check's closed loops, on each device
HOOKS = ("batch", "predict", "unbatch")  # predict_batch's three steps: featurize, the network, rerank with the LM
GPU_HEAD = ("device | clients | answers/s | p99 ms | model share | non-200 | late > 1 s | GPU use % (mean, max) | "
            "workers")


def gpu_use() -> float | None:
    """GPU 0's utilisation now, in % (nvidia-smi); None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out) if out.isdigit() else None


def profile(device: str, rounds: int, size: int = 64) -> dict:
    """Time each hook of `rounds` batches of `size` different real-shaped lists (the network on CPU as the settings
    CPU_RUNTIME and CPU_PRECISION say, as served); medians in ms, shares of the sum."""
    import torch

    from model.corrector import Corrector

    config = Config.from_env()
    corrector = Corrector(device=device, cpu_runtime=config.cpu_runtime, cpu_precision=config.cpu_precision)
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
            "share": {hook: ms / total for hook, ms in medians.items()},
            "gpu": torch.cuda.get_device_name(0) if corrector.device.type == "cuda" else None}


def hooks_table(results: list[dict]) -> list[str]:
    """One row a profile (`profile`'s figures): each hook's median ms, their sum and the network's share."""
    return report.table("device | batch | predict (the network) | unbatch | total | network's share",
                        [[f"{r['device']} {r['precision']} ({r['runtime']})",
                          *(f"{r['median_ms'][h]:.1f}" for h in HOOKS), f"{r['total_ms']:.1f}",
                          f"{100 * r['share']['predict']:.0f} %"] for r in results])


def section_hooks(plan: Namespace) -> list[dict[str, Any]]:
    """Where a batch of 64 spends its time, on each of the devices the machine has: `profile`."""
    import torch

    devices = [device for device in plan.devices if device != "cuda" or torch.cuda.is_available()]
    if not devices:
        raise cli.ToolError(f"--devices {','.join(plan.devices)}: none of them is on this machine (no CUDA)")
    return [profile(device, plan.rounds) for device in devices]


def section_gpu(plan: Namespace, servers: report.Servers) -> dict[str, Any]:
    """The GPU check: served as `make run` serves it with each DEVICE in turn, closed loops of GPU_CLIENTS, GPU use
    sampled (testing/gpu_check.sh runs it with `hooks`, a batch of 64's hooks timed on each device)."""
    import torch
    templates = payload_templates(request_bodies(400, seed=3))
    rows = []
    for device in plan.devices:
        server = servers.get(f"device-{device}", {"DEVICE": device})
        service = servers.info[f"device-{device}"]["service"] or {}
        workers, model = (service.get("config") or {}).get("workers", "?"), service.get("model") or {}
        for n in GPU_CLIENTS:
            with sampling(gpu_use, 0.5) as readings:
                point = measure_closed(server, n, plan.durations["gpu"], templates)
            point.pop("_shots"), point.pop("_start")
            samples = [use for _, use in readings if use is not None]
            use = f"{statistics.mean(samples):.0f}, {max(samples):.0f}" if samples else "-"
            rows.append({"device": device, "clients": n, "workers": workers, "model_device": model.get("device"),
                         "gpu_use": use, "gpu_samples": samples, **point})
            report.print_point(f"gpu DEVICE={device}", f"{n} clients, GPU use {use}", point)
        servers.release(f"device-{device}")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return {"rows": rows, "duration_s": plan.durations["gpu"], "machine": f"{platform.node()}: {gpu}, "
            f"{os.cpu_count()} cores"}


def gpu_lines(results: dict[str, Any]) -> list[str]:
    """The GPU check's tables (bench's section gpu), headed by when and where it ran."""
    gpu = results["gpu"]
    return [f"### GPU check, {results['started_utc'][:16].replace('T', ' ')} UTC ({gpu['machine']})", "",
            "`bash testing/gpu_check.sh` (served as `make run` serves it, closed loops of "
            f"{gpu['duration_s']:g} s after a warm-up, the request bodies of `testing.samples.request_bodies`)", "",
            *report.table(GPU_HEAD, [[r["device"], r["clients"], r["throughput_rps"], r["p99_ms"], r["model_share"],
                                      r["non_200"], r["late_over_1s"], r["gpu_use"], r["workers"]]
                                     for r in gpu["rows"]]), ""]
