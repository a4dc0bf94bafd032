"""What a run's shots add up to (latency figures, per-point summaries, markdown tables), and what each run's record
holds besides: the command, the machine, its load; one measured point of the core's load (closed or open loop) on a
served service, summarised with what the server says of it (its request log, its batcher's counters, its CPU); and
the benchmark's servers."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil

from api.metrics import BATCHER_COUNTERS
from api.paths import AnswerPath
from testing import cli, load
from testing.load import CONNECTION_PROBLEM, JUDGE_TIMEOUT_S, percentile
from testing.server import APP, FAKE_APP, REPO_ROOT, ServerProcess, get_json, scrape, start_server
from testing.shots import LoadRun, Shot

# The request log's paths answered with TOP1 (api.paths.AnswerPath.fallback): never to pass for the model's latency.
FALLBACK_PATHS = tuple(path.value for path in AnswerPath if path.fallback)


def answer_kind(path: str | None) -> str:
    """Say who made an answer: "model" (the corrector, or its cached answer), "fallback" (TOP1) or "unknown"."""
    if path is None or path == "?":
        return "unknown"
    return "fallback" if path in FALLBACK_PATHS else "model"


def fallback_share(paths: dict[str, int]) -> float:
    """Return the share of a point's answers that were TOP1 fallbacks, from its answers by path (0 when none)."""
    total = sum(paths.values())
    return sum(n for path, n in paths.items() if answer_kind(path) == "fallback") / total if total else 0.0


def tag_paths(shots: list[Shot], paths_by_uuid: dict[str, str]) -> list[Shot]:
    """Return the shots, each with the path the server logged for its esun_uuid (unchanged when not logged)."""
    return [dataclasses.replace(s, path=paths_by_uuid[s.esun_uuid]) if s.esun_uuid in paths_by_uuid else s
            for s in shots]


def paths_by_uuid(log: list[dict[str, Any]]) -> dict[str, str]:
    """Map each esun_uuid of the server's request-log lines to the path it was answered by."""
    return {str(line["esun_uuid"]): str(line.get("path", "?")) for line in log if line.get("esun_uuid")}


def connection_error(shot: Shot) -> bool:
    """Say whether a request got no answer because its connection failed, not for want of time (load's prefixes)."""
    return not shot.status and shot.problem is not None and shot.problem.startswith(CONNECTION_PROBLEM)


def latency_stats(latencies_s: list[float]) -> dict[str, float | None]:
    """Return p50/p95/p99/max/mean in milliseconds (None when there is no sample)."""
    if not latencies_s:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    ms = sorted(x * 1000 for x in latencies_s)
    p50, p95, p99 = (round(percentile(ms, q), 2) for q in (50, 95, 99))  # type: ignore[arg-type]
    return {"p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": round(ms[-1], 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


def count_paths(log: list[dict[str, Any]], start: float, end: float) -> Counter[str]:
    """Count the server's answers by path among the request-log lines stamped within [start, end] (wall clock)."""
    return Counter(line.get("path", "?") for line in log if start <= float(line.get("ts", 0)) <= end)


def summarise(shots: list[Shot], window: tuple[float, float], paths: Counter[str],
              stats_delta: dict[str, int] | None) -> dict[str, Any]:
    """Summarise one point: throughput, latency (from due), failures, lateness, paths, the model's share, batching."""
    start, end = window
    duration_s = end - start
    answered = [s for s in shots if s.status]
    out: dict[str, Any] = {
        "requests": len(shots),
        "throughput_rps": round(sum(1 for s in shots if s.status == 200 and start <= s.done < end) / duration_s, 2),
        # Answers the model made (not a TOP1 fallback or guard), from the server's log: the capacity that counts.
        "model_rps": round(paths.get("model", 0) / duration_s, 2),
        **latency_stats([s.latency_s for s in answered]),
        **kind_latency(answered),
        "non_200": sum(1 for s in shots if s.status != 200),
        "no_answer": sum(1 for s in shots if s.status == 0),
        "connection_errors": sum(1 for s in shots if connection_error(s)),
        "invalid": sum(1 for s in shots if s.status == 200 and not s.valid),
        "late_over_1s": sum(1 for s in shots if not s.status or s.latency_s > JUDGE_TIMEOUT_S),
        "valid_within_1s": sum(1 for s in shots if s.valid and s.latency_s <= JUDGE_TIMEOUT_S),
        "paths": dict(sorted(paths.items())),
        "model_share": round(1 - fallback_share(dict(paths)), 4) if paths else None,
    }
    if stats_delta:
        batches, items = stats_delta.get("batches", 0), stats_delta.get("items", 0)
        out["batcher"] = {
            **stats_delta,
            "mean_batch_size": round(items / batches, 2) if batches else None,
            "padded_waste_per_item": round(stats_delta.get("padded_waste", 0) / items, 2) if items else None,
        }
    return out


def kind_latency(answered: list[Shot]) -> dict[str, Any]:
    """Return p50/p99 of the model's answers and of the TOP1 fallbacks apart ({} when no shot's path is known)."""
    if all(s.path is None for s in answered):
        return {}
    out: dict[str, Any] = {}
    for kind in ("model", "fallback"):
        latencies = [s.latency_s for s in answered if answer_kind(s.path) == kind]
        stats = latency_stats(latencies)
        out |= {f"{kind}_answers": len(latencies), f"{kind}_p50_ms": stats["p50_ms"], f"{kind}_p99_ms": stats["p99_ms"]}
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):  # answers by path
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def table(head: str, rows: list[list[Any]]) -> list[str]:
    """Render a markdown table (`head`: the columns, split by " | "); figures right-aligned, names and paths left."""
    names = head.split(" | ")
    rule = ["---" if i == 0 or name == "answers by path" else "---:" for i, name in enumerate(names)]
    return [f"| {head} |", f"|{'|'.join(rule)}|", *(f"| {' | '.join(_fmt(v) for v in row)} |" for row in rows)]


def print_point(section: str, label: str, p: dict[str, Any]) -> None:
    print(f"bench {section}, {label}: {p['throughput_rps']} req/s, p50 {p['p50_ms']} p99 {p['p99_ms']} "
          f"max {p['max_ms']} ms, non-200 {p['non_200']}, connection errors {p['connection_errors']}, "
          f"late {p['late_over_1s']}, listen overflows {p.get('listen_overflows', '-')}, paths {p['paths']}, "
          f"generator {p['generator']} {p['generator_cpu_pct']} % of a core, server CPU "
          f"{p.get('server_cpu_pct', '-')} % of a core, {p.get('server_cpu_ms_per_answer', '-')} ms per answer, "
          f"others {p.get('others_cpu_pct', '-')} %", flush=True)


def _share(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f} %"


def markdown(results: dict[str, Any]) -> str:
    """Render the results as markdown tables."""
    machine = results["machine"]
    lines = ["## Machine", "", f"- CPU: {machine['cpu_model']} ({machine['logical_cpus']} logical CPUs, "
             f"{machine['physical_cores']} cores), RAM {machine['ram_gib']} GiB, load average at start "
             f"{machine['load_average_at_start']}, at end {machine.get('load_average_at_end')}",
             f"- Command: `{results['command']}`", f"- Started {results['started_utc']}, took {results['took_s']} s",
             ""]
    if "a" in results:
        a = results["a"]
        lines += ["## a. Offline corrector throughput (the ceiling)", "",
                  *table("batch size | items/s | ms per call (p50) | ms per item | padded chars per item",
                          [[r["batch_size"], r["items_per_s"], r["ms_per_call_p50"], r["ms_per_item"],
                            r["padded_waste_per_item_arrival_order"]] for r in a["rows"]]),
                  "", f"Ceiling: {a['ceiling_items_per_s']} items/s ({a['inputs']} inputs, torch threads "
                  f"{a['torch_threads']}).", ""]
    if "b" in results:
        b = results["b"]
        points = [(mode, p) for mode in ("on", "off") for p in b.get(mode, [])]
        lines += ["## b. Closed loop (batching on = defaults, off = MAX_BATCH_SIZE=1)", "",
                  *table("batching | clients | req/s | model req/s | p50 ms | p95 ms | p99 ms | max ms | "
                          "server p99 ms | non-200 | connection errors | late > 1 s | mean batch | server CPU % | "
                          "server CPU ms per answer | generator CPU % | answers by path",
                          [[mode, p["clients"], p["throughput_rps"], p["model_rps"], p["p50_ms"], p["p95_ms"],
                            p["p99_ms"], p["max_ms"], p.get("server_p99_ms"), p["non_200"], p.get("connection_errors"),
                            f"{p['late_over_1s']} of {p['requests']}", (p.get("batcher") or {}).get("mean_batch_size"),
                            p.get("server_cpu_pct"), p.get("server_cpu_ms_per_answer"), p.get("generator_cpu_pct"),
                            p["paths"]] for mode, p in points]),
                  "", f"Capacity (batching on, most model answers/s of the points): {_fmt(b.get('capacity_rps'))} "
                  "req/s.", ""]
    if "c" in results:
        c = results["c"]
        points, answer_s = c["points"], results["open_loop_timeout_s"]
        lines += [f"## c. Open-loop overload (Poisson arrivals; capacity {_fmt(c['capacity_rps'])} req/s)", "",
                  *table("load | target req/s | sent req/s | answered req/s | p50 ms | p99 ms | max ms | server p99 "
                          f"ms | non-200 | connection errors | no answer (> {answer_s:g} s) | late > 1 s | model share "
                          "| client lag p99 ms | listen overflows | generator CPU % | answers by path",
                          [[f"{p['factor']:g}x", p["target_rps"], p["sent_rps"], p["throughput_rps"], p["p50_ms"],
                            p["p99_ms"], p["max_ms"], p["server_p99_ms"], p["non_200"], p.get("connection_errors"),
                            p["no_answer"], f"{p['late_over_1s']} of {p['requests']}", _share(p.get("model_share")),
                            p["client_lag_p99_ms"], p.get("listen_overflows"), p.get("generator_cpu_pct"), p["paths"]]
                           for p in points]),
                  "", "Latency from each request's due time; the columns: testing/README.md, bench.py, c.", ""]
    if "f" in results:
        f, slow = results["f"], results["f"]["slow"]
        asked, valid = f["requests"], f["valid_within_1s"]
        lines += [f"## f. Slow clients ({slow['asked']} connections stalled mid-head, held open)", "",
                  *table("slow held (least / mean) | closed by the server | questions | valid 200s | valid within 1 s "
                         "| p50 ms | p99 ms | max ms | answers by path | tool CPU % | server CPU % | other processes' "
                         "CPU %", [[f"{slow['held_min']} / {slow['held_mean']}", slow["closed_by_server"], asked,
                                    asked - f["non_200"] - f["invalid"],
                                    f"{valid} ({_share(valid / asked if asked else None, 2)})", f["p50_ms"],
                                    f["p99_ms"], f["max_ms"], f["paths"], slow["tool_cpu_pct"],
                                    f.get("server_cpu_pct"), f.get("others_cpu_pct")]]),
                  "", "The slow connections each sent the start of a POST's head, then nothing; one the server "
                  "closed (its read timeout) was opened again at once. The clients asked on kept-alive connections, "
                  "closed loop; the tool (one asyncio loop: slow connections and clients) took the CPU share shown.",
                  ""]
    if "gates" in results:
        lines += ["## Each gate shown acting (a fake model: batches of 8 in 0.4 s, 20 questions/s)", "",
                  *table("scenario | offered/s | sent | non-200 | later than the judge's timeout | answers by path",
                         [[r["scenario"], r["offered_rps"], r["sent"], r["non_200"], r["late"] or 0, r["paths"]]
                          for r in results["gates"]]), ""]
    return "\n".join(lines)


def run_record(prog: str, argv: list[str]) -> dict[str, Any]:
    """Start a run's record: its exact command, when it started and the machine; warn on stderr when the machine is
    busy (torch's threads spin: another CPU-heavy process slows the model many times over, and every figure)."""
    python = Path(sys.executable)
    busy = os.getloadavg()[0]
    if busy > 0.5 * (os.cpu_count() or 1):
        print(f"{prog}: WARNING: load average {busy:.2f} on {os.cpu_count()} CPUs: the machine is busy, the figures "
              f"will be low; run it on an idle machine", file=sys.stderr, flush=True)
    return {"command": shlex.join([python.relative_to(REPO_ROOT).as_posix() if python.is_relative_to(REPO_ROOT)
                                   else sys.executable, "-m", f"testing.{prog}", *argv]),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_info()}


def machine_info() -> dict[str, Any]:
    """Describe the machine: CPU model, cores, RAM, load, software versions, the commit measured."""
    cpu_model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu_model,
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def write_summary(out: Path, name: str, results: dict[str, Any], text: str) -> None:
    """Write a run's figures (`name`.json) and its tables (`name`.md, `text`), and print the tables."""
    write_json(out / f"{name}.json", results)
    (out / f"{name}.md").write_text(text + "\n", encoding="utf-8")
    print(text)


def write_json(path: Path, data: Any) -> None:
    """Write a tool's figures as JSON, its folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# Open loop: a request unanswered this long after it was due counts as no answer.
OPEN_LOOP_ANSWER_S = 10.0
LOG_WAITS = 40  # of 50 ms: how long a point's summary waits for its answers' request-log lines


class Servers:
    """The benchmark's gunicorn servers, one per settings, started on first use and stopped on release."""

    def __init__(self, log_dir: Path, fake: bool) -> None:
        self.log_dir = log_dir
        self.app = FAKE_APP if fake else APP
        self.running: dict[str, ServerProcess] = {}
        self.info: dict[str, Any] = {}

    def get(self, name: str, settings: dict[str, str]) -> ServerProcess:
        """Return the server of this name, starting it with these settings (env) if it is not running."""
        if name not in self.running:
            print(f"bench: starting server {name} {settings or '(defaults)'}", flush=True)
            try:
                server = start_server({"LOG_LEVEL": "INFO", **settings}, self.log_dir / f"server-{name}.log",
                                      app=self.app)
            except (RuntimeError, TimeoutError) as exc:  # its log's tail is in the message: one line here
                raise cli.ToolError(f"server {name} did not start: {str(exc).splitlines()[0]}") from None
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


def measure_closed(server: ServerProcess, clients: int, duration_s: float, templates: list[str],
                   beside: Callable[[Coroutine[Any, Any, LoadRun]], Coroutine[Any, Any, LoadRun]] | None = None
                   ) -> dict[str, Any]:
    """Run one closed-loop point against a server (`beside`: run by it, on the same loop, as the benchmark's f holds
    its slow connections) and summarise it (`measure`)."""
    driver = load.closed_loop(server.url, clients, duration_s, min(1.0, duration_s / 5), templates)
    return {"clients": clients, "duration_s": duration_s,
            **measure(server, beside(driver) if beside else driver, load.CLIENT_TIMEOUT_S)}


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


def measure_open(server: ServerProcess, rate_rps: float, duration_s: float, templates: list[str],
                 warmup_s: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Run one open-loop point against a server with the core's open loop (a warm-up of `warmup_s`, by default a fifth
    of the point up to 1 s) and summarise it (`measure`), with the connections the kernel's listen queue turned away
    meanwhile (a late answer the server never saw)."""
    overflows = listen_overflows()
    warmup_s = min(1.0, duration_s / 5) if warmup_s is None else warmup_s
    point = measure(server, load.open_loop(server.url, rate_rps, duration_s, warmup_s, templates,
                                           timeout_s=OPEN_LOOP_ANSWER_S, seed=seed), OPEN_LOOP_ANSWER_S)
    overflows_after = listen_overflows()
    lags = latency_stats([s.lag_s for s in point["_shots"]])
    if point["sent_rps"] < 0.9 * rate_rps:
        print(f"load: the generator put {point['sent_rps']} req/s on the wire of the {rate_rps:.0f} "
              f"asked (lag p50 {lags['p50_ms']} ms, p99 {lags['p99_ms']} ms): a generator short of CPU lags every "
              f"request; a server slow to accept connections (a full listen queue) delays those that needed a new "
              f"one", flush=True)
    return {"target_rps": round(rate_rps, 2), "duration_s": duration_s,
            "no_answer_after_s": OPEN_LOOP_ANSWER_S, "latency_from": "due",
            "client_lag_p50_ms": lags["p50_ms"], "client_lag_p99_ms": lags["p99_ms"],
            "listen_overflows": None if overflows is None or overflows_after is None else overflows_after - overflows,
            **point}


def measure(server: ServerProcess, driver: Coroutine[Any, Any, LoadRun], answer_s: float) -> dict[str, Any]:
    """Run a driver of the core against a server and summarise its point: its shots, the server's request log (its
    lines from the point's start: the paths of answers up to answer_s after the window, the server's own latency),
    batcher counters and CPU over the window (`ServerProcess.cpu_clock`), the generator's figures; keep its shots."""
    before, offset = batcher_stats(server), server.log_offset()
    with server.cpu_clock() as clock:
        run = load.run(driver)
    after = batcher_stats(server)
    log = server.request_log(offset)
    answered = {s.esun_uuid for s in run.shots if s.status}
    for _ in range(LOG_WAITS):  # the log writer's thread writes a line just after its answer: wait for the window's
        if not log or answered <= {line.get("esun_uuid") for line in log}:  # none at all: the server logs no requests
            break
        time.sleep(0.05)
        log = server.request_log(offset)
    shots = tag_paths(run.shots, paths_by_uuid(log))
    start, end = run.start, run.end
    # the latency the server itself logged (beside the client's: where time went)
    logged = latency_stats([float(line["latency_ms"]) / 1000 for line in log
                            if start <= float(line.get("ts", 0)) <= end + answer_s and "latency_ms" in line])
    return {**summarise(shots, (start, end), count_paths(log, start, end + answer_s),
                        {k: after[k] - before[k] for k in after}),
            "server_p50_ms": logged["p50_ms"], "server_p99_ms": logged["p99_ms"], **run.generator,
            **clock.figures(start, end, sum(s.status == 200 for s in shots), run.generator["generator_cpu_pct"]),
            "_shots": shots, "_start": start}
