"""Slow clients beside the judge: many connections that stall mid-head, and a few clients posting real questions."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.slow_clients"):
    from testing import load
    from testing.load import LoadRun, Target, payload_templates, percentile
    from testing.report import measure_closed, run_record, slow_table, summarise, write_json
    from testing.samples import request_bodies
    from testing.server import ServerProcess, sampling, start_server

# The start of a POST's head; the server waits for the rest, which never comes.
SLOW_HEAD = b"POST /inference HTTP/1.1\r\nHost: slow\r\nContent-"
SAMPLE_EVERY_S = 0.25
RAMP_S = 10.0  # the longest wait for the slow connections to open before the clients start


@dataclass
class SlowStats:
    """What happened to the slow connections."""

    open_now: int = 0
    opened: int = 0
    failed_to_open: int = 0
    closed_by_server: int = 0
    answered_by_server: int = 0  # closed with some bytes first (an error answer) rather than silently
    held_s: list[float] = field(default_factory=list)


async def hold_slow(target: Target, stats: SlowStats) -> None:
    """Keep one slow connection open until cancelled, opening another whenever the server closes it."""
    while True:
        try:
            reader, writer = await asyncio.open_connection(target.host, target.port)
        except OSError:
            stats.failed_to_open += 1
            await asyncio.sleep(0.1)
            continue
        stats.opened += 1
        stats.open_now += 1
        opened_at = time.monotonic()
        try:
            writer.write(SLOW_HEAD)
            stats.answered_by_server += bool(await reader.read(65536))
        except OSError:
            pass  # reset: closed as well
        finally:
            stats.open_now -= 1
            writer.close()
        stats.closed_by_server += 1
        stats.held_s.append(time.monotonic() - opened_at)


async def beside_slow(url: str, slow: int, driver: Coroutine[Any, Any, LoadRun]) -> LoadRun:
    """Open `slow` slow connections (waiting at most RAMP_S for them), hold them while the driver (the clients) runs
    on the same event loop, and add what became of them, and the tool's CPU meanwhile, to its figures ("slow")."""
    stats, target = SlowStats(), Target.from_url(url)
    holders = [asyncio.create_task(hold_slow(target, stats)) for _ in range(slow)]
    ramp_end = time.monotonic() + RAMP_S
    while stats.open_now < slow and time.monotonic() < ramp_end:
        await asyncio.sleep(0.05)
    opened_in_ramp, cpu0, wall0 = stats.open_now, time.process_time(), time.monotonic()
    try:
        with sampling(lambda: stats.open_now, SAMPLE_EVERY_S) as readings:
            run = await driver
    finally:
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    held = [n for _, n in readings] or [0]
    run.generator["slow"] = {
        "asked": slow, "open_at_start": opened_in_ramp, "held_min": min(held),
        "held_mean": round(sum(held) / len(held), 1), "opened": stats.opened, "failed_to_open": stats.failed_to_open,
        "closed_by_server": stats.closed_by_server, "answered_by_server": stats.answered_by_server,
        "held_before_close_p50_s": None if not stats.held_s else round(percentile(stats.held_s, 50), 2),
        "held_samples": held,
        "tool_cpu_pct": round(100 * (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9), 1)}
    return run


def measure(url: str, slow: int, clients: int, seconds: float, server: ServerProcess | None = None) -> dict[str, Any]:
    """Run the clients (the core's closed loop) beside the slow connections; with the server serving url (started
    here), what its log, counters and CPU say of it (`report.measure_closed`, after its warm-up; else no warm-up)."""
    raise_open_file_limit(slow + clients + 64)
    templates = payload_templates(request_bodies(200))

    def beside(driver: Coroutine[Any, Any, LoadRun]) -> Coroutine[Any, Any, LoadRun]:
        return beside_slow(url, slow, driver)

    if server is not None:
        point = measure_closed(server, clients, seconds, templates, beside)
        point.pop("_shots"), point.pop("_start")
        return point
    run = load.run(beside(load.closed_loop(url, clients, seconds, 0.0, templates)))
    return {"clients": clients, **summarise(run.shots, (run.start, run.end), Counter(), None), **run.generator}


def raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise cli.ToolError(f"{needed} connections need {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m testing.slow_clients", description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server; default: start gunicorn as `make run` does")
    parser.add_argument("--slow", type=int, default=1000, help="slow connections to hold open (default 1000)")
    parser.add_argument("--clients", type=int, default=10, help="closed-loop clients (default 10)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the clients ask (default 20)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.slow < 0 or args.clients < 1 or args.seconds <= 0:
        parser.error("--slow must be >= 0, --clients >= 1, --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None
    if args.url is None:
        try:
            server = start_server({"LOG_LEVEL": "INFO"})
        except (RuntimeError, TimeoutError) as exc:
            raise cli.ToolError(str(exc).splitlines()[0]) from None
    url = args.url or server.url
    try:
        Target.from_url(url)
    except ValueError:
        raise cli.ToolError(f"--url must be http://HOST:PORT, got {url!r}") from None
    with server or contextlib.nullcontext():
        result = measure(url, args.slow, args.clients, args.seconds, server)
    result |= run_record("slow_clients", sys.argv[1:] if argv is None else argv)
    print("\n".join(slow_table(result)))
    if args.out:
        write_json(args.out, result)
    return 0 if result["requests"] and result["valid_within_1s"] == result["requests"] else 1


if __name__ == "__main__":
    cli.run(main, "testing.slow_clients")
