"""The benchmark: offline ceiling (a), closed loop (b), open-loop overload (c), slow clients (f); not by default, each
admission gate shown acting around a slow fake model (gates), the GPU check (gpu, testing/gpu_check.sh runs it) and
where a batch of 64 spends its time, the corrector's hooks timed apart (hooks)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.bench"):
    from config import Config
    from learn.written import wrote
    from preprocess.text import NBest, strip_spaces
    from testing import device, load, report
    from testing.load import CLIENT_TIMEOUT_S, JUDGE_TIMEOUT_S, Target, fresh_payload, payload_templates
    from testing.plots import draw_bench
    from testing.report import count_paths, markdown, measure_closed, measure_open, run_record, summarise
    from testing.samples import pool_shape, real_bodies, request_bodies, simulated_bodies
    from testing.server import FAKE_APP, REPO_ROOT, missing_weights, sampling, start_server
    from testing.shots import Shot

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
SECTIONS = ("a", "b", "c", "f", "gates", "gpu", "hooks")
DEFAULT_SECTIONS = ("a", "b", "c", "f")
B_CLIENTS = (1, 10, 64)
# f: the start of a POST's head, which a slow connection sends; the server waits for the rest, which never comes
SLOW_HEAD = b"POST /inference HTTP/1.1\r\nHost: slow\r\nContent-"
SLOW_SAMPLE_S = 0.25  # how often f counts the slow connections held
SLOW_RAMP_S = 10.0  # the longest wait for the slow connections to open before the clients start
POOL = 400  # different request bodies
DEFAULT_DURATION_S = {"a": 2.0, "b": 10.0, "c": 10.0, "f": 20.0, "gates": 10.0, "gpu": 30.0}
QUICK_DURATION_S = 3.0
SETTINGS_ON: dict[str, str] = {}
SETTINGS_OFF = {"MAX_BATCH_SIZE": "1"}
# The gates: a fake model whose batches of 8 take 0.4 s (20 questions/s), and the offered load as a multiple of that
SLOW = {"FAKE_DELAY_S": "0.4", "MAX_BATCH_SIZE": "8", "HTTP_THREADS": "32", "MAX_BATCH_WAIT_S": "0.05"}
GATE_SCENARIOS = {"slow model": 3.0, "slow model, 5x": 5.0, "slow senders": 0.0}
SENDER_DELAY_S = 0.7  # slow senders: a body's rest this long after its first byte


def request_pool(n: int, max_chars: int | None = None) -> list[dict[str, Any]]:
    """Return n request bodies the model takes: the real samples, then simulated lists (TOP1s ≤ `max_chars`)."""
    return simulated_bodies(n, ("test",), start=real_bodies(), max_chars=max_chars)


# What one run measures: the flags, with what make_plan works out from them (sections, durations, the points).
Plan = argparse.Namespace


def section_a(plan: Plan, pool: list[dict[str, Any]]) -> dict[str, Any]:
    """Offline: the corrector alone, items per second by batch size, the same inputs for every size."""
    if plan.fake:
        from tests.fakes import FakeCorrector

        corrector = FakeCorrector(delay_s=0.005)
    else:
        from model.corrector import Corrector

        corrector = Corrector(device=Config.from_env().device)
        corrector.setup()
    items = [NBest(tuple(b["sentence_list"]), tuple(b.get("phoneme_sequence_list") or ())) for b in pool]
    duration_s = plan.durations["a"]
    rows = []
    for size in plan.batch_sizes:
        batches = [items[i:i + size] for i in range(0, len(items) - size + 1, size)] or [items[:size]]
        for batch in batches[:8]:  # untimed: first calls of a batch size pay one-off costs
            corrector.predict_batch(batch)
        done = calls = 0
        times: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s or calls < 3:
            batch = batches[calls % len(batches)]
            t = time.perf_counter()
            corrector.predict_batch(batch)
            times.append(time.perf_counter() - t)
            done += len(batch)
            calls += 1
        elapsed = time.perf_counter() - started
        sizes = [[len(strip_spaces(item.top1)) for item in batch] for batch in batches]  # padded to the longest
        waste = statistics.fmean((max(s) * len(s) - sum(s)) / len(s) for s in sizes)
        rows.append({"batch_size": size, "items_per_s": round(done / elapsed, 1), "calls": calls,
                     "ms_per_call_p50": round(statistics.median(times) * 1000, 2),
                     "ms_per_item": round(elapsed / done * 1000, 3),
                     "padded_waste_per_item_arrival_order": round(waste, 2)})
        print(f"bench a: batch {size:>2}: {rows[-1]['items_per_s']:>8} items/s", flush=True)
    info = getattr(corrector, "info", {})
    return {"rows": rows, "ceiling_items_per_s": max(r["items_per_s"] for r in rows),
            "model": json.loads(json.dumps(dict(info), default=str)), "inputs": len(items),
            "torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None}


def section_b(plan: Plan, servers: report.Servers, templates: list[str]) -> dict[str, Any]:
    """Closed loop at 1, 10, 64 clients, batching on (the defaults) and off (MAX_BATCH_SIZE=1)."""
    result: dict[str, Any] = {}
    for mode, settings in (("on", SETTINGS_ON), ("off", SETTINGS_OFF)):
        server = servers.get(f"batching-{mode}", settings)
        points = []
        for clients in B_CLIENTS:
            point = measure_closed(server, clients, plan.durations["b"], templates)
            points.append(point)
            report.print_point(f"b batching {mode}", f"{clients} clients", point)
        result[mode] = points
        if mode == "off":
            servers.release(f"batching-{mode}")
    on = [p["model_rps"] for p in result["on"]]
    result["capacity_rps"] = max(on) if on else None
    return result


def section_c(plan: Plan, servers: report.Servers, templates: list[str], capacity_rps: float | None) -> dict[str, Any]:
    """Open-loop overload at 2x, 3x, 5x the capacity (batching on), probed at 64 clients when b did not run."""
    server = servers.get("batching-on", SETTINGS_ON)
    if capacity_rps is None:
        probe = measure_closed(server, 64, max(3.0, plan.durations["c"] / 2), templates)
        capacity_rps = probe["model_rps"]
        print(f"bench c: capacity probe (64 clients): {capacity_rps} req/s", flush=True)
    points = []
    for factor in plan.c_factors:
        point = measure_open(server, factor * capacity_rps, plan.durations["c"], templates)
        point["factor"] = factor
        points.append(point)
        report.print_point("c overload", f"{factor:g}x = {point['target_rps']} req/s", point)
    return {"capacity_rps": capacity_rps, "points": points}


async def beside_slow(url: str, slow: int, driver: Coroutine[Any, Any, load.LoadRun]) -> load.LoadRun:
    """Open `slow` slow connections (waiting at most SLOW_RAMP_S for them), hold them while the driver (the clients)
    runs on the same event loop, and add what became of them, and the tool's CPU meanwhile, to its figures ("slow")."""
    target, held_s = Target.from_url(url), []
    # answered_by_server: closed with some bytes first (an error answer) rather than silently
    count = dict.fromkeys(("open_now", "opened", "failed_to_open", "closed_by_server", "answered_by_server"), 0)

    async def hold() -> None:  # one slow connection until cancelled, another opened whenever the server closes it
        while True:
            try:
                reader, writer = await asyncio.open_connection(target.host, target.port)
            except OSError:
                count["failed_to_open"] += 1
                await asyncio.sleep(0.1)
                continue
            count["opened"] += 1
            count["open_now"] += 1
            opened_at = time.monotonic()
            try:
                writer.write(SLOW_HEAD)
                count["answered_by_server"] += bool(await reader.read(65536))
            except OSError:
                pass  # reset: closed as well
            finally:
                count["open_now"] -= 1
                writer.close()
            count["closed_by_server"] += 1
            held_s.append(time.monotonic() - opened_at)

    holders = [asyncio.create_task(hold()) for _ in range(slow)]
    ramp_end = time.monotonic() + SLOW_RAMP_S
    while count["open_now"] < slow and time.monotonic() < ramp_end:
        await asyncio.sleep(0.05)
    opened_in_ramp, cpu0, wall0 = count["open_now"], time.process_time(), time.monotonic()
    try:
        with sampling(lambda: count["open_now"], SLOW_SAMPLE_S) as readings:
            run = await driver
    finally:
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    held = [n for _, n in readings] or [0]
    run.generator["slow"] = {
        "asked": slow, "open_at_start": opened_in_ramp, "held_min": min(held),
        "held_mean": round(sum(held) / len(held), 1), **{k: n for k, n in count.items() if k != "open_now"},
        "held_before_close_p50_s": None if not held_s else round(load.percentile(held_s, 50), 2),
        "held_samples": held,
        "tool_cpu_pct": round(100 * (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9), 1)}
    return run


def section_f(plan: Plan, servers: report.Servers) -> dict[str, Any]:
    """Slow clients: --clients closed-loop clients (the core's) beside --slow slow connections (`beside_slow`); on the
    batching-on server measured as a point of b (`report.measure_closed`, after its warm-up: its log, counters and
    CPU), or on `--url`'s server from the clients' side alone, no warm-up."""
    needed = plan.slow + plan.clients + 64  # open files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise cli.ToolError(f"{needed} connections need {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    templates = payload_templates(request_bodies(200))
    if plan.url is None:
        server = servers.get("batching-on", SETTINGS_ON)
        point = measure_closed(server, plan.clients, plan.durations["f"], templates,
                               lambda driver: beside_slow(server.url, plan.slow, driver))
        point.pop("_shots"), point.pop("_start")
    else:
        run = load.run(beside_slow(plan.url, plan.slow,
                                   load.closed_loop(plan.url, plan.clients, plan.durations["f"], 0.0, templates)))
        point = {"clients": plan.clients, **summarise(run.shots, (run.start, run.end), Counter(), None),
                 **run.generator}
    report.print_point("f", f"{plan.slow} slow connections held, {plan.clients} clients", point)
    return point


async def slow_send(url: str, template: str) -> int:
    """Send one request's head and the first byte of its body, the rest SENDER_DELAY_S later; return the status."""
    target = Target.from_url(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    body = fresh_payload(template)[1]
    request = target.request(body)
    writer.write(request[:len(request) - len(body) + 1])
    await writer.drain()
    await asyncio.sleep(SENDER_DELAY_S)
    writer.write(body[1:])
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


def section_gates(plan: Plan, log_dir: Path) -> list[dict[str, Any]]:
    """Each gate shown acting: a slow fake model (SLOW) under open-loop load at GATE_SCENARIOS' multiples of its
    capacity, then slow senders; each scenario's answers by path from the server's own log."""
    templates = payload_templates(request_bodies(400))
    rows = []
    for name, factor in GATE_SCENARIOS.items():
        with start_server(SLOW, log_dir / f"gates-{name.replace(' ', '-')}.log", app=FAKE_APP) as server:
            if name == "slow senders":
                async def senders() -> list[int]:
                    return await asyncio.gather(*(slow_send(server.url, t) for t in templates[:20]))

                start = time.time()
                statuses = asyncio.run(senders())
                end, late, offered = time.time(), None, None
            else:
                offered = factor * 8 / float(SLOW["FAKE_DELAY_S"])
                point = load.run(load.open_loop(server.url, offered, plan.durations["gates"], 2.0, templates))
                start, end, statuses = point.start, point.end, [shot.status for shot in point.shots]
                late = sum(shot.latency_s > JUDGE_TIMEOUT_S for shot in point.shots)
            paths = count_paths(server.request_log(), start, end)
        rows.append({"scenario": name, "settings": SLOW, "offered_rps": offered, "sent": len(statuses),
                     "non_200": sum(s != 200 for s in statuses), "late": late, "paths": dict(sorted(paths.items()))})
        print(f"bench gates, {name}: {rows[-1]}", flush=True)
    return rows


def _raw_series(point: dict[str, Any]) -> list[list[Any]]:
    """Take a point's shots out of it as bench_raw.json's rows (testing/README.md), in order of due time."""
    shots: list[Shot] = point.pop("_shots")
    start: float = point.pop("_start")
    return [[round(s.due - start, 4), round(s.latency_s * 1000, 2), s.status, int(s.valid), round(s.lag_s * 1000, 2),
             s.path] for s in sorted(shots, key=lambda s: s.due)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testing.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                        help="sections to run, e.g. b,c (default a,b,c,f; gates: each gate shown acting)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds a point (default a 2, b 10, c 10, f 20, gates 10)")
    parser.add_argument("--quick", action="store_true", help=f"fewer points, {QUICK_DURATION_S:g} s each: a smoke run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench", help="where results go")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs in OUT/logs")
    parser.add_argument("--fake", action="store_true", help="serve the FakeCorrector (figures meaningless)")
    parser.add_argument("--capacity", type=float, default=None, metavar="RPS",
                        help="what c's factors multiply when b does not run (default: a probe at 64 clients)")
    parser.add_argument("--factors", default=None, metavar="F,F,...",
                        help="c's loads as multiples of the capacity, in order (default 2,3,5), e.g. 3,3,3,3,3")
    parser.add_argument("--devices", default="cuda,cpu",
                        help="gpu: the DEVICE settings to serve with, in turn; hooks: those to time on (cuda if any)")
    parser.add_argument("--rounds", type=int, default=30, help="hooks: batches of 64 timed (default 30)")
    parser.add_argument("--markdown", type=Path, help="gpu: append its table to this file (docs/benchmarks.md)")
    parser.add_argument("--max-chars", type=int, default=None, metavar="N",
                        help="short lists: every TOP1 at most N characters (a cheaper model, a busier door)")
    parser.add_argument("--slow", type=int, default=None, metavar="N",
                        help="f: slow connections to hold open (default 1000, --quick 200)")
    parser.add_argument("--clients", type=int, default=10, metavar="N", help="f: closed-loop clients (default 10)")
    parser.add_argument("--url", help="f alone, against this running server instead of one the bench starts")
    return parser


def make_plan(args: argparse.Namespace) -> Plan:
    """Work out what the run measures: the sections, each one's seconds a point, its points (fewer with --quick)."""
    args.sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        raise cli.ToolError(f"unknown section(s) {unknown}: choose from {','.join(SECTIONS)}")
    duration = args.duration if args.duration is not None else (QUICK_DURATION_S if args.quick else None)
    args.durations = {s: duration if duration is not None else default for s, default in DEFAULT_DURATION_S.items()}
    if args.quick:
        args.durations["a"] = min(args.durations["a"], 1.0)
    args.batch_sizes = (1, 8, 64) if args.quick else BATCH_SIZES
    try:
        args.c_factors = tuple(float(f) for f in (args.factors or ("2" if args.quick else "2,3,5")).split(","))
    except ValueError:
        raise cli.ToolError(f"--factors must be numbers separated by commas, got {args.factors!r}") from None
    args.slow = (200 if args.quick else 1000) if args.slow is None else args.slow
    if args.slow < 0 or args.clients < 1 or args.rounds < 1:
        raise cli.ToolError("--slow must be >= 0, --clients and --rounds >= 1")
    if args.fake and "hooks" in args.sections:
        raise cli.ToolError("--sections hooks times the shipped model's hooks: it does not go with --fake")
    if args.url is not None:
        try:
            Target.from_url(args.url)
        except ValueError:
            raise cli.ToolError(f"--url must be http://HOST:PORT, got {args.url!r}") from None
        if args.sections != ("f",):
            raise cli.ToolError("--url goes with --sections f alone")
    args.devices = tuple(args.devices.split(","))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    plan = make_plan(args)
    cli.require_weights(args.fake or plan.url is not None or plan.sections == ("gates",), missing_weights())
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"bench: the results go to {out} (--out DIR writes them elsewhere)", flush=True)
    started = time.time()
    results: dict[str, Any] = {
        **run_record("bench", argv),
        "fake_corrector": plan.fake,
        "durations_s": {s: plan.durations[s] for s in plan.sections if s in plan.durations},
        "judge_timeout_s": JUDGE_TIMEOUT_S,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "open_loop_timeout_s": report.OPEN_LOOP_ANSWER_S,
    }
    if plan.fake:
        print("bench: serving a FakeCorrector (--fake): the figures say nothing about the model", flush=True)
    pool = request_pool(POOL, plan.max_chars) if {"a", "b", "c"} & set(plan.sections) else []
    templates = payload_templates(pool)
    if pool:
        results["request_pool"] = {**pool_shape(pool), "real": len(real_bodies())}
    raw: dict[str, list[list[Any]]] = {}
    log_dir = out / "logs" if args.keep_logs else Path(tempfile.mkdtemp(prefix="esun-bench-"))
    servers = report.Servers(log_dir, plan.fake)
    try:
        if "a" in plan.sections:
            results["a"] = section_a(plan, pool)
        if "b" in plan.sections:
            results["b"] = section_b(plan, servers, templates)
            for mode in ("on", "off"):
                for p in results["b"][mode]:
                    raw[f"b/batching {mode}/{p['clients']} clients"] = _raw_series(p)
        if "c" in plan.sections:
            capacity = results.get("b", {}).get("capacity_rps") or plan.capacity
            results["c"] = section_c(plan, servers, templates, capacity)
            for p in results["c"]["points"]:
                raw[f"c/overload/{p['factor']:g}x"] = _raw_series(p)
        if "f" in plan.sections:
            results["f"] = section_f(plan, servers)
        if "gates" in plan.sections:
            results["gates"] = section_gates(plan, log_dir)
        if "gpu" in plan.sections:
            results["gpu"] = device.section_gpu(plan, servers)
        if "hooks" in plan.sections:
            results["hooks"] = device.section_hooks(plan)
        results["servers"] = servers.info
    finally:
        servers.close()
        if not args.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    results["took_s"] = round(time.time() - started, 1)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["plots"] = draw_bench(results, raw, out)
    (out / "bench_raw.json").write_text(json.dumps(raw, separators=(",", ":")) + "\n", encoding="utf-8")
    gpu = device.gpu_lines(results) if "gpu" in results else []
    hooks = [f"### Hooks: one batch of 64 lists, median of {plan.rounds}, in ms", "",
             *device.hooks_table(results["hooks"]), ""] if "hooks" in results else []
    report.write_summary(out, "bench", results, "\n".join([markdown(results), *hooks, *gpu]))
    if args.markdown and gpu:
        with args.markdown.open("a", encoding="utf-8") as md:
            md.write("\n" + "\n".join(gpu + hooks) + "\n")
    print(f"bench: bench.json, bench_raw.json, bench.md and {len(results['plots'])} plot(s): {wrote(out)}")
    f = results.get("f")  # f fails the run where a question was not answered validly within 1 s
    return 1 if f is not None and not 0 < f["requests"] == f["valid_within_1s"] else 0


if __name__ == "__main__":
    cli.run(main, "testing.bench")
