"""Swap weights folders there and back under closed-loop load (issue 47), as `make run` serves: gunicorn with
`WEIGHTS_DIR` a symlink, every answer timed, every worker's RSS sampled.

The second folder is the shipped one with no fitted second stage and a threshold of 1.01 (`linked_folder`): the
network alone then never changes a character, so every answer of it is TOP1's, told apart from the shipped model's
wherever that one corrects. The run: traffic on the shipped folder (phase `a`), the link repointed to the second
(`ln -sfn`), traffic until every worker says (/metrics) it serves it and `phase_s` more (`b`), the link back, the
same (`a_again`). tests/api/test_swap_live.py asserts on what it returns; docs/deploy.md quotes its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from config import DEFAULT_WEIGHTS_DIR
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE, WeightsMeta
from preprocess.text import top1_answer
from testing import cli, load
from testing.load import JUDGE_TIMEOUT_S, payload_templates, percentile
from testing.report import paths_by_uuid, write_json
from testing.samples import request_bodies
from testing.server import get_json, metric_samples, sampling, start_server
from testing.shots import Shot

QUESTIONS = 200  # few enough that each phase asks again what the one before asked
SWAP_TIMEOUT_S = 240.0


@dataclass
class Swap:
    """The link repointed at `asked`; every worker serving `folder` from `done` on (time.time())."""

    folder: str
    asked: float
    done: float


@dataclass
class SwapRun:
    asked: list[Shot]  # every request: sent at `due`, its body `question` of `top1`, its `answer` (a valid one's)
    paths: dict[str, str]  # esun_uuid -> the path its answer took (the server's request log)
    server_ms: dict[str, float]  # esun_uuid -> the server's latency (accept to answer, its request log)
    swaps: list[Swap]
    rss: dict[int, list[tuple[float, float]]]  # worker (or model process) pid -> (time.time(), RSS MiB)
    top1: list[str]  # each question's TOP1 answer
    served: dict[str, Any] = field(default_factory=dict)


def linked_folder(out: Path, top1_only: bool = False) -> Path:
    """The shipped folder under another path, its parts linked; `top1_only`: with no fitted second stage and a
    threshold of 1.01, its answers always TOP1's."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (NETWORK_FILE, VOCAB_FILE) if top1_only else (CONFIG_FILE, NETWORK_FILE, VOCAB_FILE):
        (out / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    if top1_only:
        WeightsMeta.load(DEFAULT_WEIGHTS_DIR).replace(rerank={}, threshold=1.01).save(out)
    return out


def wait_served(url: str, folder: Path, workers: int, timeout_s: float) -> float:
    """Wait until every worker serves `folder` (each worker's label of esun_model_served_since_seconds in /metrics);
    return when (time.time())."""
    until, served = time.monotonic() + timeout_s, {}
    while time.monotonic() < until:
        with contextlib.suppress(requests.RequestException):
            served = {sample.labels.get("worker", ""): sample.labels["folder"] for sample in metric_samples(url)
                      if sample.name == "esun_model_served_since_seconds"}
            if len(served) == workers and set(served.values()) == {str(folder)}:
                return time.time()
        time.sleep(0.25)
    raise TimeoutError(f"not every worker served {folder} within {timeout_s:g} s: {served}")


def run(workdir: Path, clients: int = 8, workers: int = 2, phase_s: float = 8.0, swaps: int = 2,
        batcher_workers: int = 1, precision: str = "int8") -> SwapRun:
    """Serve the shipped folder through a link, swap to the second folder and back under load (module docstring),
    `swaps` times in all (there, back, there, ...); `precision` is CPU_PRECISION."""
    first, second = linked_folder(workdir / "shipped"), linked_folder(workdir / "top1", top1_only=True)
    link, beside = workdir / "current", workdir / "current.new"
    link.symlink_to(first)
    bodies = request_bodies(QUESTIONS)
    settings = {"WEB_WORKERS": str(workers), "WEIGHTS_DIR": str(link), "LOG_LEVEL": "INFO",
                "BATCHER_WORKERS": str(batcher_workers), "CPU_PRECISION": precision}
    done: list[Swap] = []
    with start_server(settings, workdir / "server.log") as server:
        wait_served(server.url, first, workers, SWAP_TIMEOUT_S)  # /readyz is one worker's: wait for all
        stop = threading.Event()
        with sampling(server.processes, 0.25) as readings, ThreadPoolExecutor(1) as pool:
            loading = pool.submit(load.run, load.closed_loop(server.url, clients, math.inf, 0.0,
                                                             payload_templates(bodies), until=stop, answers=True))
            time.sleep(phase_s)
            for n in range(swaps):
                folder = second if n % 2 == 0 else first
                asked = time.time()
                # what `ln -sfn folder link` does, atomically: a new link beside it, renamed over it
                beside.unlink(missing_ok=True)
                beside.symlink_to(folder)
                beside.replace(link)
                done.append(Swap(str(folder), asked, wait_served(server.url, folder, workers, SWAP_TIMEOUT_S)))
                time.sleep(phase_s)
            stop.set()
            run = loading.result()
        served = (get_json(f"{server.url}/") or {}).get("serving") or {}
        lines = server.request_log()
    rss: dict[int, list[tuple[float, float]]] = {}
    for at, processes in readings:
        for process in processes:
            if process["role"] != "master":
                rss.setdefault(process["pid"], []).append((at, process["rss_mib"]))
    paths = paths_by_uuid(lines)
    server_ms = {line["esun_uuid"]: float(line.get("latency_ms", 0.0)) for line in lines}
    return SwapRun(run.shots, paths, server_ms, done, rss, [top1_answer(b["sentence_list"]) for b in bodies], served)


def summary(result: SwapRun) -> dict[str, Any]:
    """The figures the test asserts and the docs quote; latencies (client and server side) apart for the questions
    asked while a swap was under way (from the link's change until every worker served the new folder)."""
    paths = [result.paths.get(a.esun_uuid, "?") for a in result.asked]
    memory = []  # each worker's RSS (MiB): the last sample before each swap, the peak during it, the last of the run
    for pid, samples in result.rss.items():
        before = [next((r for t, r in reversed(samples) if t < s.asked), 0) for s in result.swaps]
        peaks = [max((r for t, r in samples if s.asked <= t <= s.done), default=0) for s in result.swaps]
        memory.append({"worker": pid, "before_swap_mib": [int(r) for r in before],
                       "peak_during_swap_mib": [int(r) for r in peaks], "first_mib": int(samples[0][1]),
                       "max_mib": int(max(r for _, r in samples)), "end_mib": int(samples[-1][1])})

    def slowest(during: bool) -> dict[str, float]:
        asked = [a for a in result.asked if any(s.asked <= a.due <= s.done for s in result.swaps) == during]
        client = [a.latency_s for a in asked]
        server = [result.server_ms.get(a.esun_uuid, 0.0) for a in asked]
        return {"answers": len(asked), "client_max_s": round(max(client, default=0.0), 3),
                "client_p99_s": round(percentile(client, 99) or 0.0, 3),
                "server_max_ms": round(max(server, default=0.0), 1),
                "server_p99_ms": round(percentile(server, 99) or 0.0, 1)}

    return {
        "answers": len(result.asked),
        "non_200": sum(a.status != 200 for a in result.asked),
        "later_than_1s": sum(a.latency_s > JUDGE_TIMEOUT_S for a in result.asked),
        "paths": {p: paths.count(p) for p in sorted(set(paths))},
        "latency_while_swapping": slowest(True),
        "latency_otherwise": slowest(False),
        "swap_s": [round(s.done - s.asked, 1) for s in result.swaps],
        "memory": memory,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.swap_load", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--phase-s", type=float, default=8.0)
    parser.add_argument("--swaps", type=int, default=2, help="swaps in all: to the second folder, back, ... (0: a "
                        "baseline, phase-s of load on the shipped folder)")
    parser.add_argument("--batcher-workers", type=int, default=1, help="BATCHER_WORKERS: above 1, the process engine")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="a new folder for the run's weights folders and link (default: a new one under /tmp)")
    parser.add_argument("--out", type=Path, default=None, help="write the run's summary here (JSON)")
    args = parser.parse_args()
    if args.workdir is not None and args.workdir.exists():
        raise cli.ToolError(f"--workdir {args.workdir} exists: name a new folder (the run writes its folders there)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="esun-swap-load-"))
    workdir.mkdir(parents=True, exist_ok=True)
    figures = summary(run(workdir, args.clients, args.workers, args.phase_s, args.swaps, args.batcher_workers))
    print(json.dumps(figures, indent=1))
    if args.out is not None:
        write_json(args.out, figures)
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.swap_load")
