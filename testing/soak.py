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
   lag, server RSS; totals, and memory growth as a least-squares slope (MiB/min) after the first 10 % of the run.
   Writes soak.json and soak.png (latency, throughput and RSS over time) into --out (default docs/bench/).

Exits 1 when a request failed or came late, 2 when the server could not be started or reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testing import cli

with cli.dev_requirements("testing.soak"):
    import psutil
    import requests

    from testing.samples import check_answer, request_bodies, with_fresh_uuid
    from testing.server import REPO_ROOT, ServerProcess, missing_weights, start_server

JUDGE_TIMEOUT_S = 1.0
# Clients wait longer than the judge, to see how late a late answer is.
CLIENT_TIMEOUT_S = 5.0
RSS_PERIOD_S = 1.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class Shot:
    """One request: when it was due (seconds into the run), how long it took from then, and how it ended."""

    due_s: float
    latency_s: float
    lag_s: float
    status: int  # 0 when no HTTP answer came (connection error, timeout)
    problem: str | None  # what the judge would reject, None for a valid answer


@dataclass(frozen=True)
class Server:
    """What the soak aims at: its URL, its processes (for RSS), its request log if known, its settings."""

    url: str
    pids: list[int]
    log_path: Path | None
    config: dict[str, Any]


class Client:
    """POST bodies like the judge: a fresh connection per request (no keep-alive), the answer checked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False  # the server is on loopback: never through a proxy
        return session

    def send(self, body: dict[str, Any]) -> tuple[int, str | None]:
        """Send one body; return the status (0 when none came) and what is wrong with the answer, if anything."""
        try:
            response = self._session().post(f"{self.url}/inference", json=body, timeout=CLIENT_TIMEOUT_S,
                                            headers={"Connection": "close"})
        except requests.RequestException as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            data = response.json()
        except ValueError:
            data = response.text[:200]
        return response.status_code, check_answer(response.status_code, data, body["esun_uuid"])


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


def request_log_paths(log_path: Path | None, since: float, until: float) -> Counter[str] | None:
    """Count the server's answers by path in a window of wall-clock time, from its JSON request log."""
    if log_path is None or not log_path.exists():
        return None
    paths: Counter[str] = Counter()
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if record.get("logger") == "api.requests" and since <= record.get("ts", 0) <= until:
                paths[record.get("path", "?")] += 1
    return paths


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
            status, problem = client.send(with_fresh_uuid(bodies[n % len(bodies)]))
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


def soak(client: Client, bodies: list[dict[str, Any]], rate_per_s: float, seconds: float,
         on_progress: Callable[[float, int], None]) -> tuple[list[Shot], float]:
    """Send at a fixed rate for `seconds`, whatever the answers do; return every shot and the monotonic start."""
    shots: list[Shot] = []
    lock = threading.Lock()
    started = time.monotonic()

    def send(index: int, due: float) -> None:
        lag = max(0.0, time.monotonic() - due)
        status, problem = client.send(with_fresh_uuid(bodies[index % len(bodies)]))
        shot = Shot(due - started, time.monotonic() - due, lag, status, problem)
        with lock:
            shots.append(shot)

    count = int(rate_per_s * seconds)
    pool_size = max(16, min(512, math.ceil(rate_per_s * CLIENT_TIMEOUT_S)))
    next_report = started + 10.0
    with ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="soak") as pool:
        for i in range(count):
            due = started + i / rate_per_s
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, i, due)
            if time.monotonic() >= next_report:
                with lock:
                    done = len(shots)
                on_progress(time.monotonic() - started, done)
                next_report += 10.0
    return sorted(shots, key=lambda s: s.due_s), started


def percentile(values: list[float], q: float) -> float | None:
    """Return the q-th percentile (nearest rank) of values, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def latency_ms(shots: list[Shot]) -> dict[str, float | None]:
    """Summarise the latencies of the answered shots in milliseconds."""
    values = [s.latency_s * 1000 for s in shots if s.status]
    return {name: (None if (v := percentile(values, q)) is None else round(v, 1))
            for name, q in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}


def late(shot: Shot) -> bool:
    return shot.latency_s > JUDGE_TIMEOUT_S


def buckets(shots: list[Shot], rss: list[tuple[float, int, int]], seconds: float,
            bucket_s: float) -> list[dict[str, Any]]:
    """Summarise the run per window of bucket_s seconds: counts, latency, lag and server RSS."""
    out = []
    for k in range(math.ceil(seconds / bucket_s)):
        start, end = k * bucket_s, min((k + 1) * bucket_s, seconds)
        inside = [s for s in shots if start <= s.due_s < end]
        memory = [total for t, total, _ in rss if start <= t < end]
        out.append({
            "start_s": round(start, 2), "end_s": round(end, 2), "sent": len(inside),
            "answered": sum(1 for s in inside if s.problem is None),
            "failed": sum(1 for s in inside if s.problem is not None),
            "late": sum(1 for s in inside if late(s)),
            "latency_ms": latency_ms(inside),
            "lag_ms_max": round(max((s.lag_s for s in inside), default=0.0) * 1000, 1),
            "rss_mib": round(max(memory) / MIB, 1) if memory else None,
        })
    return out


def rss_summary(rss: list[tuple[float, int, int]], seconds: float) -> dict[str, float | None]:
    """Describe the server's memory: start, end, max and slope (least squares, MiB/min) after the first 10 %."""
    if not rss:
        return {"start_mib": None, "end_mib": None, "max_mib": None, "slope_mib_per_min": None}
    settled = [(t, total) for t, total, _ in rss if t >= 0.1 * seconds] or [(t, total) for t, total, _ in rss]
    slope = None
    if len(settled) >= 2:
        mean_t = sum(t for t, _ in settled) / len(settled)
        mean_m = sum(m for _, m in settled) / len(settled)
        var = sum((t - mean_t) ** 2 for t, _ in settled)
        if var > 0:
            slope = sum((t - mean_t) * (m - mean_m) for t, m in settled) / var * 60 / MIB
    return {"start_mib": round(rss[0][1] / MIB, 1), "end_mib": round(rss[-1][1] / MIB, 1),
            "max_mib": round(max(total for _, total, _ in rss) / MIB, 1),
            "slope_mib_per_min": None if slope is None else round(slope, 3)}


def plot(path: Path, shots: list[Shot], rss: list[tuple[float, int, int]], table: list[dict[str, Any]],
         budget_s: float | None, title: str) -> None:
    """Draw latency, throughput and server RSS over time into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_rate, ax_rss) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    mids = [(b["start_s"] + b["end_s"]) / 2 / 60 for b in table]
    answered = [s for s in shots if s.status]
    ax_lat.scatter([s.due_s / 60 for s in answered], [s.latency_s * 1000 for s in answered], s=2, alpha=0.25,
                   color="tab:gray", label="each request")
    for name, color in (("p50", "tab:blue"), ("p95", "tab:orange"), ("p99", "tab:red")):
        ax_lat.plot(mids, [b["latency_ms"][name] for b in table], color=color, label=name)
    ax_lat.axhline(JUDGE_TIMEOUT_S * 1000, color="black", linestyle="--", label="judge timeout")
    if budget_s:
        ax_lat.axhline(budget_s * 1000, color="tab:green", linestyle=":", label="answer budget")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.legend(loc="upper right", fontsize="small")
    widths = [(b["end_s"] - b["start_s"]) or 1 for b in table]
    ax_rate.plot(mids, [b["sent"] / w for b, w in zip(table, widths, strict=True)], label="sent/s")
    ax_rate.plot(mids, [b["answered"] / w for b, w in zip(table, widths, strict=True)], label="valid answers/s")
    ax_rate.plot(mids, [(b["failed"] + b["late"]) / w for b, w in zip(table, widths, strict=True)],
                 color="tab:red", label="failed or late/s")
    ax_rate.set_ylabel("requests/s")
    ax_rate.legend(loc="upper right", fontsize="small")
    if rss:
        ax_rss.plot([t / 60 for t, _, _ in rss], [total / MIB for _, total, _ in rss], label="all processes")
        ax_rss.plot([t / 60 for t, _, _ in rss], [big / MIB for _, _, big in rss], label="largest (the worker)")
        ax_rss.legend(loc="lower right", fontsize="small")
    else:
        ax_rss.text(0.5, 0.5, "server processes unknown: no RSS", ha="center", transform=ax_rss.transAxes)
    ax_rss.set_ylabel("server RSS (MiB)")
    ax_rss.set_xlabel("minutes into the run")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    client = Client(server.url)
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
    shots, _ = soak(client, bodies, rate, seconds,
                    lambda t, done: print(f"  {t:6.0f} s: {done} answered, RSS "
                                          f"{sampler.samples[-1][1] / MIB if sampler.samples else 0:.0f} MiB"))
    sampler.stop()
    wall_end = time.time()

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
    plot(png_path, shots, sampler.samples, table, server.config.get("budget_s"),
         f"soak: {rate:.1f} req/s for {args.minutes:g} min, {server.url}")
    print_summary(report)
    print(f"wrote {json_path} and {png_path}")
    return 1 if failed or late_shots else 0


def print_summary(report: dict[str, Any]) -> None:
    totals, rss = report["totals"], report["rss"]
    print(f"sent {totals['sent']}, valid {totals['answered']}, failed {totals['failed']}, late {totals['late']};"
          f" latency ms {totals['latency_ms']}; client lag max {totals['lag_ms_max']} ms")
    if totals["paths"]:
        print(f"paths: {totals['paths']}")
    print(f"server RSS MiB: start {rss['start_mib']}, end {rss['end_mib']}, max {rss['max_mib']},"
          f" slope {rss['slope_mib_per_min']} MiB/min")
    for problem, count in report["failures"]:
        print(f"  {count} x {problem}")


if __name__ == "__main__":
    cli.run(main, "testing.soak")
