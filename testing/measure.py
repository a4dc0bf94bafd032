"""One measured point of the core's load (testing/load.py: closed or open loop) on a served service, summarised with
what the server says of it (its request log, its batcher's counters, its CPU); and the benchmark's servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api.metrics import BATCHER_COUNTERS
from testing import load
from testing.load import LoadRun
from testing.report import count_paths, latency_stats, paths_by_uuid, server_latency, summarise, tag_paths
from testing.server import ServerProcess, app_of, get_json, scrape, start_server

# Open loop: a request unanswered this long after it was due counts as no answer.
OPEN_LOOP_ANSWER_S = 10.0


class Servers:
    """The benchmark's gunicorn servers, one per settings, started on first use and stopped on release."""

    def __init__(self, log_dir: Path, fake: bool) -> None:
        self.log_dir = log_dir
        self.app = app_of(fake)
        self.running: dict[str, ServerProcess] = {}
        self.info: dict[str, Any] = {}

    def get(self, name: str, settings: dict[str, str]) -> ServerProcess:
        """Return the server of this name, starting it with these settings (env) if it is not running."""
        if name not in self.running:
            print(f"bench: starting server {name} {settings or '(defaults)'}", flush=True)
            server = start_server({"LOG_LEVEL": "INFO", **settings}, self.log_dir / f"server-{name}.log", app=self.app)
            self.running[name] = server
            self.info[name] = {"settings": settings, "service": get_json(server.url + "/")}
        return self.running[name]

    def release(self, name: str) -> None:
        """Stop the server of this name."""
        self.running.pop(name).stop()

    def close(self) -> None:
        for server in self.running.values():
            server.stop()


def batcher_stats(server: ServerProcess) -> dict[str, int]:
    """Read the batcher's counters (each served as `esun_batcher_<name>_total`) from the server's /metrics."""
    return {k: int(v) for k, v in scrape(server.url, {f"esun_batcher_{k}_total": k for k in BATCHER_COUNTERS}).items()}


def measure_closed(server: ServerProcess, clients: int, duration_s: float, templates: list[str]) -> dict[str, Any]:
    """Run one closed-loop point against a server and summarise it, with its raw shots and the server's CPU over the
    window."""
    before, offset = batcher_stats(server), server.log_offset()
    with server.cpu_clock() as clock:
        run = load.run(load.closed_loop(server.url, clients, duration_s, min(1.0, duration_s / 5), templates))
    return {"clients": clients, "duration_s": duration_s, **summary(server, run, 0.0, before, offset),
            **run.generator, **clock.figures(run.start, run.end, sum(s.status == 200 for s in run.shots))}


def listen_overflows(netstat: Path = Path("/proc/net/netstat")) -> int | None:
    """The kernel's count of connections its listen queues turned away (TcpExt ListenOverflows: a SYN or an
    established connection dropped because the queue was full, which the client retries after a second or more);
    None where it cannot be read (not Linux)."""
    try:
        lines = netstat.read_text(encoding="ascii").splitlines()
        names, values = (line.split() for line in lines if line.startswith("TcpExt:"))
        return int(dict(zip(names, values, strict=True))["ListenOverflows"])
    except (OSError, ValueError, KeyError):
        return None


def measure_open(server: ServerProcess, rate_rps: float, duration_s: float, templates: list[str]) -> dict[str, Any]:
    """Run one open-loop point against a server with the core's open loop and summarise it, with its raw shots, and
    the connections the kernel's listen queue turned away meanwhile (a late answer the server never saw)."""
    before, offset, overflows = batcher_stats(server), server.log_offset(), listen_overflows()
    run = load.run(load.open_loop(server.url, rate_rps, duration_s, min(1.0, duration_s / 5), templates,
                                  timeout_s=OPEN_LOOP_ANSWER_S))
    overflows_after = listen_overflows()
    lags = latency_stats([s.lag_s for s in run.shots])
    if run.generator["sent_rps"] < 0.9 * rate_rps:
        print(f"bench c: the load generator put {run.generator['sent_rps']} req/s on the wire of the {rate_rps:.0f} "
              f"asked (lag p50 {lags['p50_ms']} ms, p99 {lags['p99_ms']} ms): a generator short of CPU lags every "
              f"request; a server slow to accept connections (a full listen queue) delays those that needed a new "
              f"one", flush=True)
    return {"target_rps": round(rate_rps, 2), **run.generator, "duration_s": duration_s,
            "no_answer_after_s": OPEN_LOOP_ANSWER_S, "latency_from": "due",
            "client_lag_p50_ms": lags["p50_ms"], "client_lag_p99_ms": lags["p99_ms"],
            "listen_overflows": None if overflows is None or overflows_after is None else overflows_after - overflows,
            **summary(server, run, OPEN_LOOP_ANSWER_S, before, offset)}


def summary(server: ServerProcess, run: LoadRun, answer_s: float, before: dict[str, int],
            log_offset: int) -> dict[str, Any]:
    """Summarise a point from its shots and the server's request log (its lines from `log_offset` on: the paths of
    answers up to answer_s after the window, the server's own latency) and batcher counters; keep its raw shots."""
    after = batcher_stats(server)
    log, _ = server.request_log_since(log_offset)
    shots = tag_paths(run.shots, paths_by_uuid(log))
    start, end = run.start, run.end
    return {**summarise(shots, (start, end), count_paths(log, start, end + answer_s),
                        {k: after[k] - before[k] for k in after}),
            **server_latency(log, start, end + answer_s), "_shots": shots, "_start": start}
