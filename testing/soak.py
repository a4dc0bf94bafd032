"""Soak run: the service under steady load for minutes, watching its resident memory and its latency over time.

    .venv/bin/python -m testing.soak                                   # gunicorn + the shipped model, 10 min at 70 %
    .venv/bin/python -m testing.soak --minutes 60 --rate 30            # a fixed rate, an hour
    .venv/bin/python -m testing.soak --url http://127.0.0.1:8081 --minutes 0.2 --out /tmp/soak   # a running server

Not a test (not collected by pytest, not in CI). Steps:

1. Server. Without --url it starts gunicorn as `make run` does (testing/server.py: the real model, which needs
   the weights in model/weights/), on a free loopback port, and stops it at the end with SIGTERM. With --url it
   uses that server; its processes are --server-pid, else whichever process listens on the URL's loopback port
   (gunicorn's master and worker both do: the tree under the topmost one is measured).
2. Rate. --rate, else --load (default 0.7) times a capacity measured first, for --measure-s seconds in a closed
   loop of --clients clients: model answers per second, counted from the server's request log when this script
   started the server (or --server-log names it), else answers that came faster than 90 % of the answer budget
   (a deadline fallback takes the whole budget, so those are model answers or TOP1 guards).
3. Soak. Open loop at that rate (fixed intervals, each request on a thread of a pool, latency counted from the
   time it was due, the load generator's lag reported apart), each body from testing.samples under a fresh
   esun_uuid, every answer checked as the judge would (testing.samples.check_answer); every second the resident
   memory (RSS) of the server's processes (psutil).
4. Report per --bucket-s window: sent, answered, failed, late (past the judge's timeout), latency p50/p95/p99/max,
   lag, TOP1 fallbacks (when the server's log is known), server RSS; totals, and memory growth as a least-squares
   slope (MiB/min) after the first 10 % of the run. Writes soak.json and soak.png (latency, model answers and TOP1
   fallbacks apart, throughput and RSS over time) into --out (default docs/bench/).

Exits 1 when a request failed or came late, 2 when the server could not be started or reached.

This module finds the server and samples its memory; the load is testing/loadgen.py's (`fixed_rate`, the judge's
client), the windows and summary testing/report.py's, the picture testing/plots.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testing import cli

with cli.dev_requirements("testing.soak"):
    import psutil
    import requests

    from testing.loadgen import CLIENT_TIMEOUT_S, Client, fixed_rate, judge_client
    from testing.plots import draw_soak
    from testing.report import (
        MIB,
        buckets,
        late,
        latency_ms,
        print_summary,
        request_log_by_uuid,
        request_log_paths,
        rss_summary,
        tag_paths,
    )
    from testing.samples import request_bodies, with_fresh_uuid
    from testing.server import REPO_ROOT, ServerProcess, missing_weights, start_server

RSS_PERIOD_S = 1.0


@dataclass(frozen=True)
class Server:
    """What the soak aims at: its URL, its processes (for RSS), its request log if known, its settings."""

    url: str
    pids: list[int]
    log_path: Path | None
    config: dict[str, Any]


class RssSampler(threading.Thread):
    """Every period, the RSS of the server's processes and their children: (seconds, total bytes, largest bytes)."""

    def __init__(self, pids: list[int], started: float, period_s: float = RSS_PERIOD_S) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pids = pids
        self.started = started
        self.period_s = period_s
        self.samples: list[tuple[float, int, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            sizes = process_rss(self.pids)
            if sizes:
                self.samples.append((time.monotonic() - self.started, sum(sizes), max(sizes)))
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def process_rss(pids: list[int]) -> list[int]:
    """Return the RSS of each of these processes and of their children (gunicorn's workers), once each."""
    seen: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    seen[proc.pid] = proc.memory_info().rss
    return list(seen.values())


def listening_pids(url: str) -> list[int]:
    """Find the processes listening on the URL's port on this machine; for gunicorn's worker, its master."""
    port = urlsplit(url).port or 80
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    except psutil.AccessDenied:
        return []
    return sorted({_gunicorn_master(pid) for pid in pids})


def _gunicorn_master(pid: int) -> int:
    """Return the gunicorn master above a gunicorn worker (which may be the only listener found), else pid."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        proc = psutil.Process(pid)
        parent = proc.parent()
        if parent is not None and all("gunicorn" in " ".join(p.cmdline()) for p in (proc, parent)):
            return parent.pid
    return pid


def server_config(url: str) -> dict[str, Any]:
    """Read the server's settings from GET / (the service describes itself there); {} if it does not."""
    with contextlib.suppress(requests.RequestException, ValueError):
        response = requests.get(f"{url}/", timeout=5, proxies={"http": "", "https": ""})
        if response.ok:
            return response.json().get("config", {})
    return {}


def measure_capacity(client: Client, bodies: list[dict[str, Any]], server: Server, clients: int,
                     seconds: float) -> dict[str, Any]:
    """Measure model answers per second in a closed loop of `clients` clients for `seconds`."""
    budget_s = float(server.config.get("budget_s", 0.75))
    stop_at = time.monotonic() + seconds
    results: list[tuple[float, int, str | None]] = []
    lock = threading.Lock()

    def loop(index: int) -> None:
        n = index
        while time.monotonic() < stop_at:
            started = time.monotonic()
            status, problem = client.send_body(with_fresh_uuid(bodies[n % len(bodies)]))
            with lock:
                results.append((time.monotonic() - started, status, problem))
            n += clients

    wall_start = time.time()
    with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="measure") as pool:
        list(pool.map(loop, range(clients)))
    wall_end = time.time()
    paths = request_log_paths(server.log_path, wall_start, wall_end + 1.0)
    if paths:
        served, method = paths.get("model", 0), "model answers in the server's request log"
    else:
        served = sum(1 for latency, status, _ in results if status == 200 and latency < 0.9 * budget_s)
        method = f"200 answers faster than 90 % of the budget ({budget_s:g} s)"
    return {"per_s": served / seconds, "clients": clients, "seconds": seconds, "requests": len(results),
            "method": method, "paths": dict(paths) if paths else None}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server; default: start gunicorn with the real model")
    parser.add_argument("--server-pid", type=int, action="append", default=[],
                        help="the server's process id(s) for RSS (with --url); default: the port's listener")
    parser.add_argument("--server-log", type=Path, help="the server's JSON log (with --url), to count paths")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting (Config's environment variable) for the server started here, e.g. "
                             "CACHE_SIZE=1000 to tell the answer cache's growth from a leak; repeatable")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to soak (default 10)")
    parser.add_argument("--rate", type=float, help="requests per second; default: --load x measured capacity")
    parser.add_argument("--load", type=float, default=0.7, help="share of the capacity to send (default 0.7)")
    parser.add_argument("--measure-s", type=float, default=10.0, help="capacity measurement length (default 10)")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients to measure capacity with")
    parser.add_argument("--bucket-s", type=float, help="report window in seconds (default: run length / 60)")
    parser.add_argument("--bodies", type=int, default=200, help="distinct request bodies to cycle through")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench", help="where to write results")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0, help="wait this long for a started server")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if any("=" not in item for item in args.server_setting):
        parser.error("--server-setting takes NAME=VALUE")
    if args.url and args.server_setting:
        parser.error("--server-setting applies to a server started here, not to --url")
    if args.minutes <= 0 or (args.rate is not None and args.rate <= 0) or not 0 < args.load <= 10:
        parser.error("--minutes and --rate must be > 0, --load in (0, 10]")
    return args


def open_server(args: argparse.Namespace, log_dir: Path) -> tuple[Server, ServerProcess | None]:
    """Use --url, or start gunicorn with the real model; describe the server either way."""
    if args.url:
        url = args.url.rstrip("/")
        pids = args.server_pid or listening_pids(url)
        return Server(url, pids, args.server_log, server_config(url)), None
    missing = missing_weights()
    if missing:
        raise RuntimeError(f"model/weights/ lacks {', '.join(missing)}: train or fetch the weights, or use --url")
    settings = dict(item.split("=", 1) for item in args.server_setting)
    process = start_server(settings, log_path=log_dir / "soak-server.log", ready_timeout_s=args.ready_timeout_s)
    return Server(process.url, [process.process.pid], process.log_path, server_config(process.url)), process


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seconds = args.minutes * 60
    bucket_s = args.bucket_s or max(1.0, seconds / 60)
    log_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        server, process = open_server(args, log_dir)
    except (RuntimeError, TimeoutError) as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args, server, seconds, bucket_s)
    finally:
        if process is not None:
            code = process.stop()
            print(f"server stopped (exit {code}); its log: {process.log_path}")


def run(args: argparse.Namespace, server: Server, seconds: float, bucket_s: float) -> int:
    """Measure (unless --rate), soak, report; return the exit status."""
    client = judge_client(server.url)
    bodies = request_bodies(args.bodies)
    if not server.config:
        print(f"soak: {server.url}/ did not describe the server; is it this service?", file=sys.stderr)
        return 2
    if not server.pids:
        print("soak: the server's processes were not found: no RSS (pass --server-pid)", file=sys.stderr)
    capacity = None
    rate = args.rate
    if rate is None:
        capacity = measure_capacity(client, bodies, server, args.clients, args.measure_s)
        print(f"capacity: {capacity['per_s']:.1f}/s ({capacity['method']}, {capacity['clients']} clients)")
        rate = max(0.5, args.load * capacity["per_s"])
    print(f"soak: {rate:.1f} requests/s for {args.minutes:g} min against {server.url} (pids {server.pids})")

    sampler = RssSampler(server.pids, time.monotonic())
    sampler.start()
    wall_start = time.time()
    shots, _ = fixed_rate(client, bodies, rate, seconds,
                    lambda t, done: print(f"  {t:6.0f} s: {done} answered, RSS "
                                          f"{sampler.samples[-1][1] / MIB if sampler.samples else 0:.0f} MiB"))
    sampler.stop()
    wall_end = time.time()
    # Each request's path (model or a TOP1 fallback) from the server's log, when known: the plot tells them apart.
    shots = tag_paths(shots, request_log_by_uuid(server.log_path, wall_start, wall_end + CLIENT_TIMEOUT_S) or {})

    table = buckets(shots, sampler.samples, seconds, bucket_s)
    failed = [s for s in shots if s.problem is not None]
    late_shots = [s for s in shots if late(s)]
    paths = request_log_paths(server.log_path, wall_start, wall_end + CLIENT_TIMEOUT_S)
    report = {
        "command": shlex.join([".venv/bin/python", "-m", "testing.soak", *args.argv]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_start)),
        "url": server.url, "server_pids": server.pids, "server_config": server.config,
        "minutes": args.minutes, "rate_per_s": round(rate, 3), "capacity": capacity, "bucket_s": bucket_s,
        "totals": {"sent": len(shots), "answered": len(shots) - len(failed), "failed": len(failed),
                   "late": len(late_shots), "latency_ms": latency_ms(shots),
                   "lag_ms_max": round(max((s.lag_s for s in shots), default=0.0) * 1000, 1),
                   "paths": dict(paths) if paths else None},
        "rss": rss_summary(sampler.samples, seconds),
        "failures": Counter(s.problem for s in failed).most_common(10),
        "buckets": table,
        "rss_samples": [[round(t, 2), total, big] for t, total, big in sampler.samples],
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "soak.json", args.out / "soak.png"
    json_path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    draw_soak(png_path, shots, sampler.samples, table, server.config.get("budget_s"),
              f"soak: {rate:.1f} req/s for {args.minutes:g} min ({report['started_at']})")
    print_summary(report)
    print(f"wrote {json_path} and {png_path}")
    return 1 if failed or late_shots else 0


if __name__ == "__main__":
    cli.run(main, "testing.soak")
