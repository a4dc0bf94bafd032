"""Slow clients beside the judge: many connections that stall mid-head, and a few clients posting real questions."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.slow_clients"):
    import psutil

    from testing.load import JUDGE_TIMEOUT_S, Shot, Target, closed_loop, payload_templates, percentile
    from testing.report import latency_stats, run_record, write_json
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


async def hold_slow(target: Target, end: float, stats: SlowStats) -> None:
    """Keep one slow connection open until `end`, opening another whenever the server closes it."""
    while (left := end - time.monotonic()) > 0:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), timeout=left)
        except (TimeoutError, OSError):
            stats.failed_to_open += 1
            await asyncio.sleep(0.1)
            continue
        stats.opened += 1
        stats.open_now += 1
        opened_at = time.monotonic()
        try:
            writer.write(SLOW_HEAD)
            data = await asyncio.wait_for(reader.read(65536), timeout=end - time.monotonic())
            stats.closed_by_server += 1
            stats.answered_by_server += bool(data)
            stats.held_s.append(time.monotonic() - opened_at)
        except TimeoutError:
            pass  # the run ended with the connection still held
        except OSError:
            stats.closed_by_server += 1  # reset
            stats.held_s.append(time.monotonic() - opened_at)
        finally:
            stats.open_now -= 1
            writer.close()


async def run(url: str, slow: int, clients: int, seconds: float, timeout_s: float,
              server_cpu: Callable[[], float] | None = None) -> dict[str, Any]:
    """Hold the slow connections, then run the clients for `seconds`; CPU times are taken over those seconds."""
    stats, target = SlowStats(), Target.from_url(url)
    ramp_end = time.monotonic() + RAMP_S
    slow_end = ramp_end + seconds + timeout_s + 1.0  # held until the last question is answered
    holders = [asyncio.create_task(hold_slow(target, slow_end, stats)) for _ in range(slow)]
    while stats.open_now < slow and time.monotonic() < ramp_end:
        await asyncio.sleep(0.05)
    opened_in_ramp = stats.open_now
    templates = payload_templates(request_bodies(200))
    server_cpu_start = server_cpu() if server_cpu else 0.0
    machine_start = _machine_busy_s()
    cpu_start, wall_start = time.process_time(), time.monotonic()
    with sampling(lambda: stats.open_now, SAMPLE_EVERY_S) as held:
        run = await closed_loop(url, clients, seconds, 0.0, templates, timeout_s)
    cpu_s, wall_s = time.process_time() - cpu_start, time.monotonic() - wall_start
    server_cpu_s = server_cpu() - server_cpu_start if server_cpu else None
    machine_s = _machine_busy_s() - machine_start
    for holder in holders:
        holder.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    result = {"slow": _slow_summary(stats, [n for _, n in held], slow, opened_in_ramp),
              "questions": _question_summary(run.shots, run.start),
              "tool_cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2), "tool_cpu_share": round(cpu_s / wall_s, 3)}
    if server_cpu_s is not None:
        result["server_cpu_s"] = round(server_cpu_s, 2)
        result["server_cpu_share"] = round(server_cpu_s / wall_s, 2)
        # what other processes took meanwhile: figures compare only between runs where it was small
        result["others_cpu_share"] = round(max(machine_s - server_cpu_s - cpu_s, 0.0) / wall_s, 2)
    result["machine_cores"] = psutil.cpu_count()
    return result


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all processes, all cores) since boot."""
    times = psutil.cpu_times()  # on Linux guest time is already in user; steal is the hypervisor's
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


def _slow_summary(stats: SlowStats, held: list[int], asked: int, opened_in_ramp: int) -> dict[str, Any]:
    samples = held or [0]
    return {"asked": asked, "open_at_start": opened_in_ramp, "held_min": min(samples),
            "held_mean": round(sum(samples) / len(samples), 1), "opened": stats.opened,
            "failed_to_open": stats.failed_to_open, "closed_by_server": stats.closed_by_server,
            "answered_by_server": stats.answered_by_server,
            "held_before_close_p50_s": None if not stats.held_s else round(percentile(stats.held_s, 50), 2),
            "held_samples": held}


def _question_summary(shots: list[Shot], start: float) -> dict[str, Any]:
    valid = [s.latency_s for s in shots if s.valid]
    in_time = [latency for latency in valid if latency <= JUDGE_TIMEOUT_S]
    stats = latency_stats(valid)
    return {"sent": len(shots), "valid": len(valid), "failed": len(shots) - len(valid),
            "within_1s": len(in_time), "within_1s_share": round(len(in_time) / len(shots), 4) if shots else None,
            "p50_ms": stats["p50_ms"], "p99_ms": stats["p99_ms"], "max_ms": stats["max_ms"],
            "problems": dict(Counter(s.problem for s in shots if s.problem is not None).most_common(5)),
            # when each question not answered validly within 1 s was sent, in seconds from the clients' start
            "late_sent_at_s": [round(s.due - start, 2) for s in shots if not s.valid or s.latency_s > JUDGE_TIMEOUT_S]}


def measure(url: str, slow: int, clients: int, seconds: float, timeout_s: float,
            server: ServerProcess | None = None) -> dict[str, Any]:
    """Run the slow connections and the clients; with the server serving url (started here), its CPU and paths."""
    raise_open_file_limit(slow + clients + 64)
    log_start = len(server.request_log()) if server else 0
    probe = server.cpu_s if server else None
    result = asyncio.run(run(url, slow, clients, seconds, timeout_s, probe))
    if server is not None:
        result["server_paths"] = dict(server.paths(since=log_start))
    return result


def raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise cli.ToolError(f"{needed} connections need {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def print_report(result: dict[str, Any]) -> None:
    s, q = result["slow"], result["questions"]
    print(f"slow connections: {s['asked']} asked, {s['open_at_start']} open when the clients started, held "
          f"{s['held_min']} at least / {s['held_mean']} on average; {s['opened']} opened in all, "
          f"{s['closed_by_server']} closed by the server (after {s['held_before_close_p50_s']} s at the median, "
          f"{s['answered_by_server']} with an answer), {s['failed_to_open']} failed to open")
    share = "-" if q["within_1s_share"] is None else f"{q['within_1s_share'] * 100:.2f} %"
    print(f"questions: {q['sent']} sent, {q['valid']} valid 200s, {q['failed']} failed, {q['within_1s']} "
          f"answered validly within 1 s ({share}); p50 {q['p50_ms']} ms, p99 {q['p99_ms']} ms, max {q['max_ms']} ms")
    for problem, count in q["problems"].items():
        print(f"  {count} x {problem}")
    print(f"tool CPU: {result['tool_cpu_s']} s over {result['wall_s']} s ({result['tool_cpu_share'] * 100:.1f} % "
          "of one core)")
    if "server_cpu_s" in result:
        print(f"server CPU: {result['server_cpu_s']} s ({result['server_cpu_share'] * 100:.0f} % of one core); "
              f"answers by path: {result.get('server_paths')}")
        print(f"other processes on this {result['machine_cores']}-core machine meanwhile: "
              f"{result['others_cpu_share'] * 100:.0f} % of one core")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m testing.slow_clients", description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server; default: start gunicorn as `make run` does")
    parser.add_argument("--slow", type=int, default=1000, help="slow connections to hold open (default 1000)")
    parser.add_argument("--clients", type=int, default=10, help="closed-loop clients (default 10)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the clients ask (default 20)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="a client's timeout (default 5; over 1 s is late)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.slow < 0 or args.clients < 1 or args.seconds <= 0 or args.timeout_s <= 0:
        parser.error("--slow must be >= 0, --clients >= 1, --seconds and --timeout-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None
    if args.url is None:
        try:
            server = start_server()
        except (RuntimeError, TimeoutError) as exc:
            raise cli.ToolError(str(exc).splitlines()[0]) from None
    url = args.url or server.url
    try:
        Target.from_url(url)
    except ValueError:
        raise cli.ToolError(f"--url must be http://HOST:PORT, got {url!r}") from None
    with server or contextlib.nullcontext():
        result = measure(url, args.slow, args.clients, args.seconds, args.timeout_s, server)
    result |= run_record("slow_clients", sys.argv[1:] if argv is None else argv)
    print_report(result)
    if args.out:
        write_json(args.out, result)
    questions = result["questions"]
    return 0 if questions["sent"] and questions["within_1s"] == questions["sent"] else 1


if __name__ == "__main__":
    cli.run(main, "testing.slow_clients")

