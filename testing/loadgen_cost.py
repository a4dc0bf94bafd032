"""What each load generator costs in CPU per request on this machine, against the same server.

    .venv/bin/python -m testing.loadgen_cost [--seconds 5] [--clients 10] [--rate 400] [--out docs/bench]

On a 2-core machine the load generator takes CPU from the server it measures, so the benchmark uses the cheapest
generator that still measures what it must (per-request latency from the due time, status, connection errors,
the esun_uuid of each request to find the path the server answered it by). This runs each candidate for
`--seconds` against one gunicorn server (the bench app around testing/fakes.py's FakeCorrector, 5 ms a batch,
so that the server's own cost stays small and the same for all), closed loop with `--clients` connections, and
the open-loop candidates at `--rate` requests/s; it reports each generator's own CPU time (user + system: its
process's for the Python ones, os.wait4's resource usage for the programs) per request and as a share of one core.

Candidates, closed loop: `wrk` with testing/wrk.lua (a fresh body and esun_uuid per request, each answer noted),
plain `wrk` (one static body: its floor), `h2load --h1`, `hey`, `siege -b` (one static body each: they cannot send
a different body per request, so the service answers them from its cache after the first; only their own cost is
compared), testing/aioload.py on asyncio's own loop and on uvloop, and testing/loadgen.py's threads (the bench's
generator before). Open loop: aioload (both loops) and loadgen's threads. Writes loadgen_cost.json and
loadgen_cost.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.loadgen_cost"):
    from testing import aioload, loadgen, wrkload
    from testing.samples import request_bodies
    from testing.server import REPO_ROOT, ServerProcess, start_server

FAKE_APP = "testing.bench_app:create_bench_app(fake=True)"


def _in_process(run: Callable[[], tuple[list[loadgen.Shot], Any]]) -> dict[str, Any]:
    """Run a Python generator here; return its shots' counts and this process's CPU time over the run."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    shots = run()[0]
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"requests": len(shots), "ok": sum(1 for s in shots if s.status == 200), "cpu_s": cpu_s,
            "wall_s": wall_s}


def _program(command: list[str], env: dict[str, str] | None = None, seconds: float = 5) -> dict[str, Any]:
    """Run an external generator to its end; return its CPU time (os.wait4) and wall time; requests counted apart."""
    wall0 = time.perf_counter()
    code, cpu_s, output = wrkload._run(command, {**os.environ, **(env or {})}, seconds + 30)
    return {"exit": code, "cpu_s": cpu_s, "wall_s": time.perf_counter() - wall0, "output": output}


def _served_between(server: ServerProcess, since: float, until: float) -> int:
    """Count the inference requests the server logged between two wall-clock times (all generators alike)."""
    return sum(1 for line in server.request_log() if since <= float(line.get("ts", 0)) <= until)


def measure(server: ServerProcess, seconds: float, clients: int, rate: float) -> list[dict[str, Any]]:
    """Run every installed candidate once; return one row each (requests answered, CPU s, us per request)."""
    templates = loadgen.payload_templates(request_bodies(64))
    url = server.url
    tmp = Path(tempfile.mkdtemp(prefix="esun-loadgen-cost-"))
    body = tmp / "body.json"
    body.write_bytes(loadgen.fresh_payload(templates[0])[1])
    rows: list[dict[str, Any]] = []
    warm = min(1.0, seconds / 5)

    def python(name: str, loop: str, run: Callable[[], Any]) -> None:
        since = time.time()
        figures = _in_process(run)
        figures["served"] = _served_between(server, since, time.time())
        rows.append({"generator": name, "loop": loop, **figures})

    def program(name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        if shutil.which(command[0]) is None:
            rows.append({"generator": name, "loop": "closed", "missing": True})
            return
        since = time.time()
        figures = _program(command, env, seconds)
        figures["served"] = _served_between(server, since, time.time())
        figures.pop("output")
        rows.append({"generator": name, "loop": "closed", **figures})

    inference = url + "/inference"
    secs = f"{int(seconds)}s"
    if wrkload.wrk_path():
        since = time.time()
        _, _, _, generator = wrkload.closed_loop(url, clients, seconds - warm - wrkload.TAIL_S, warm, templates)
        rows.append({"generator": "wrk + testing/wrk.lua", "loop": "closed", "cpu_s": generator["generator_cpu_s"],
                     "wall_s": generator["generator_wall_s"], "served": _served_between(server, since, time.time())})
    else:
        rows.append({"generator": "wrk + testing/wrk.lua", "loop": "closed", "missing": True})
    program("wrk, one static body", ["wrk", "-t", "1", "-c", str(clients), "-d", secs, "-s",
                                     str(_static_wrk_script(tmp, body)), inference])
    program("h2load --h1, one static body", ["h2load", "--h1", "-t", "1", "-c", str(clients), "-D", str(int(seconds)),
                                            "-d", str(body), "-H", "Content-Type: application/json", inference])
    program("hey, one static body", ["hey", "-z", secs, "-c", str(clients), "-m", "POST", "-T", "application/json",
                                     "-D", str(body), inference])
    program("siege -b, one static body", ["siege", "-b", "-q", "-j", "--no-parser", "-c", str(clients), "-t",
                                          f"{int(seconds)}S", "-T", "application/json", f"{inference} POST < {body}"])
    for loop_name in aioload.LOOPS:
        with aioload.using_loop(loop_name):
            python(f"aioload ({loop_name})", "closed",
                   lambda: aioload.closed_loop(url, clients, seconds - warm, warm, templates))
    python("loadgen threads + requests", "closed",
           lambda: loadgen.closed_loop(url, clients, seconds - warm, warm, templates))
    for loop_name in aioload.LOOPS:
        with aioload.using_loop(loop_name):
            python(f"aioload ({loop_name})", f"open {rate:g}/s",
                   lambda: aioload.open_loop(url, rate, seconds - warm, warm, templates, timeout_s=5))
    python("loadgen threads + requests", f"open {rate:g}/s",
           lambda: loadgen.open_loop(url, rate, seconds - warm, warm, templates))
    shutil.rmtree(tmp, ignore_errors=True)
    for row in rows:
        if "cpu_s" in row:
            row["cpu_pct_of_one_core"] = round(100 * row["cpu_s"] / row["wall_s"], 1)
            row["cpu_us_per_served_request"] = round(1e6 * row["cpu_s"] / row["served"], 1) if row["served"] else None
            row["cpu_s"], row["wall_s"] = round(row["cpu_s"], 3), round(row["wall_s"], 2)
    return rows


def _static_wrk_script(tmp: Path, body: Path) -> Path:
    script = tmp / "static.lua"
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = io.open({json.dumps(str(body))}):read('*a')\n", encoding="utf-8")
    return script


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Load generators' own CPU per request ({report['started_utc']})", "",
             f"`{report['command']}`: each generator for {report['seconds']:g} s against one gunicorn server "
             f"(bench app, FakeCorrector), closed loop with {report['clients']} connections, open loop at "
             f"{report['rate']:g} req/s; machine: {report['cpus']} CPUs, load average at start "
             f"{report['load_average_at_start']}. CPU = the generator's user + system time; served = inference "
             "requests the server logged during the run.", "",
             "| generator | loop | served | CPU s | % of one core | CPU us per request |",
             "|---|---|---:|---:|---:|---:|"]
    for row in report["rows"]:
        if row.get("missing"):
            lines.append(f"| {row['generator']} | {row['loop']} | not installed | | | |")
            continue
        lines.append(f"| {row['generator']} | {row['loop']} | {row['served']} | {row['cpu_s']} | "
                     f"{row['cpu_pct_of_one_core']} | {row['cpu_us_per_served_request']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m testing.loadgen_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per generator (default 5)")
    parser.add_argument("--clients", type=int, default=10, help="closed-loop connections (default 10)")
    parser.add_argument("--rate", type=float, default=400.0, help="open-loop requests/s (default 400)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench", help="where results go")
    args = parser.parse_args(argv)
    started = time.time()
    report: dict[str, Any] = {"command": " ".join([".venv/bin/python", "-m", "testing.loadgen_cost", *argv]),
                              "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
                              "seconds": args.seconds, "clients": args.clients, "rate": args.rate,
                              "cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    log = Path(tempfile.mkdtemp(prefix="esun-loadgen-cost-log-")) / "server.log"
    server = start_server({"LOG_LEVEL": "INFO"}, log, app=FAKE_APP)
    try:
        report["rows"] = measure(server, args.seconds, args.clients, args.rate)
    finally:
        server.stop()
        shutil.rmtree(log.parent, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loadgen_cost.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    text = markdown(report)
    (args.out / "loadgen_cost.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.loadgen_cost")
