"""The soak: the service for N minutes at a fixed share of its own 64-client rate, recorded interval by interval
(`--distinct N`: lists new to the server, do its caches stay bounded). A benchmark, not a test (issue 40);
testing/README.md ("soak.py") says what it sends and records."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.soak"):
    from preprocess.text import strip_spaces
    from testing import report
    from testing.load import JUDGE_TIMEOUT_S, payload_templates
    from testing.plots import draw_soak
    from testing.report import OPEN_LOOP_ANSWER_S, measure_closed, run_record, table, write_json, write_summary
    from testing.samples import pool_shape, real_bodies, simulated_bodies
    from testing.server import APP, FAKE_APP, REPO_ROOT, ServerProcess, get_json, missing_weights, scrape, start_server

PROBE_CLIENTS = 64
REAL_SHAPED_CHARS = (15, 20)  # TOP1 length of the real-shaped lists, with 10 hypotheses each
SHORT_CHARS = (4, 8)  # TOP1 length of the short ones
POOL = 1000  # different lists (each request still goes under a new esun_uuid)
SPLITS = ("test", "dev")  # the corpus's held-out sentences: about 1,300 real-shaped lists and 3,000 short ones
ROLES = ("master", "worker", "model")


def request_pool(n: int, short_share: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return n bodies in a seeded order, `short_share` of them short lists, the rest real-shaped; and their shape."""
    def top1_chars(body: dict[str, Any]) -> int:
        return len(strip_spaces(body["sentence_list"][0]))

    candidates = simulated_bodies(12 * n, SPLITS, start=real_bodies(), distinct=False)
    low, high = REAL_SHAPED_CHARS
    shaped = [b for b in candidates if len(b["sentence_list"]) == 10 and low <= top1_chars(b) <= high]
    short = [b for b in candidates if SHORT_CHARS[0] <= top1_chars(b) <= SHORT_CHARS[1]]
    n_short = round(n * short_share)
    if len(shaped) < n - n_short or len(short) < n_short:
        raise cli.ToolError(f"the corpus gave {len(shaped)} real-shaped and {len(short)} short lists, fewer than the "
                            f"{n - n_short} and {n_short} asked: ask for a smaller pool")
    pool = shaped[:n - n_short] + short[:n_short]
    random.Random(0).shuffle(pool)
    return pool, {**pool_shape(pool), "real_shaped": n - n_short, "short": n_short,
                  "real_shaped_top1_chars": list(REAL_SHAPED_CHARS), "short_top1_chars": list(SHORT_CHARS)}


def run_interval(server: ServerProcess, rate_rps: float, seconds: float, templates: list[str], index: int,
                 shift: int) -> dict[str, Any]:
    """Drive one interval of open-loop load, the pool taken from `shift` on (where the last interval stopped);
    return its record."""
    counters = {"esun_batch_duration_seconds_sum": "batch_s", "esun_batch_duration_seconds_count": "batches",
                "esun_cache_entries": "cache_entries"}
    before, shift = scrape(server.url, counters), shift % len(templates)
    point = report.measure_open(server, rate_rps, seconds, templates[shift:] + templates[:shift], 0.0, index)
    processes, after = server.processes(), scrape(server.url, counters)
    model = scrape(server.url, {"esun_request_duration_seconds_count": "answers"}, path="model")
    batch_s, batches = after["batch_s"] - before["batch_s"], after["batches"] - before["batches"]
    items, by_role = point["batcher"]["items"], {}
    for role in ROLES:  # RSS, descriptors and threads summed over the processes of each role (and counted)
        mine = [p for p in processes if p["role"] == role]
        by_role[role] = {"processes": len(mine), "rss_mib": round(sum(p["rss_mib"] for p in mine), 1),
                         "fds": sum(p["fds"] for p in mine), "threads": sum(p["threads"] for p in mine)}
    return {
        "interval": index, "end_s": None,
        # Whether the model slowed, or the server got less CPU (a busy machine): its share of one core (beside the
        # other processes'), and the corrector's mean run time per batch and per question in the interval.
        **{k: point.get(k) for k in ("target_rps", "sent_rps", "requests", "throughput_rps", "p50_ms", "p99_ms",
                                     "max_ms", "late_over_1s", "non_200", "no_answer", "connection_errors", "invalid",
                                     "model_share", "paths", "server_p50_ms", "server_p99_ms", "server_cpu_pct",
                                     "others_cpu_pct", "generator_cpu_pct")},
        "mean_batch_size": point["batcher"]["mean_batch_size"],
        "batch_ms_mean": round(1000 * batch_s / batches, 1) if batches else None,
        "batch_ms_per_question": round(1000 * batch_s / items, 2) if items else None,
        "cache_entries": int(after["cache_entries"]),
        "model_answers_so_far": int(model["answers"]),
        **full_gc(server.url),
        "by_role": by_role, "processes": processes, "load_average": round(os.getloadavg()[0], 2),
    }


def full_gc(url: str) -> dict[str, float]:
    """The full GC collections of the worker that answers the scrape so far, and their seconds."""
    return scrape(url, {"esun_gc_collections_total": "gc_full_collections", "esun_gc_pause_seconds_total": "gc_full_s"},
                  generation="2")


def served(record: dict[str, Any], figure: str) -> float:
    """A record's figure summed over the workers and the model processes."""
    return record["by_role"]["worker"][figure] + record["by_role"]["model"][figure]


def steady_state(intervals: list[dict[str, Any]], settle_s: float) -> dict[str, Any] | None:
    """What the records after the first `settle_s` seconds show (None if none): the server's RSS (workers and model
    processes together) at the first and last of them, its growth and range; the range of descriptors and threads;
    late and non-200 answers over them."""
    kept = [r for r in intervals if r["end_s"] > settle_s]
    if not kept:
        return None
    rss = [round(served(r, "rss_mib"), 1) for r in kept]
    # the least-squares line through the records: a trend that one record's phase (a batch's peak, a heap trim
    # just before it) does not decide, as the first and last records alone do
    minutes = [r["end_s"] / 60 for r in kept]
    mean_rss = statistics.fmean(rss)
    slope = statistics.linear_regression(minutes, rss).slope if len(kept) > 1 else 0.0
    trend = slope * (minutes[-1] - minutes[0])
    return {"records": len(kept), "from_minute": round(kept[0]["end_s"] / 60, 2),
            "to_minute": round(kept[-1]["end_s"] / 60, 2), "rss_first_mib": rss[0], "rss_last_mib": rss[-1],
            "rss_growth_pct": round(100 * (rss[-1] - rss[0]) / rss[0], 2) if rss[0] else None,
            "rss_min_mib": min(rss), "rss_max_mib": max(rss), "rss_trend_mib": round(trend, 1),
            "rss_trend_pct": round(100 * trend / mean_rss, 2) if mean_rss else None,
            "fds": [min(served(r, "fds") for r in kept), max(served(r, "fds") for r in kept)],
            "threads": [min(served(r, "threads") for r in kept), max(served(r, "threads") for r in kept)],
            "late_over_1s": sum(r["late_over_1s"] for r in kept), "non_200": sum(r["non_200"] for r in kept)}


def steady_line(steady: dict[str, Any] | None) -> str:
    """The steady-state figures as one sentence."""
    if steady is None:
        return "no record after the settling minutes"
    return (f"from minute {steady['from_minute']:g} to {steady['to_minute']:g} ({steady['records']} records): RSS "
            f"{steady['rss_first_mib']} -> {steady['rss_last_mib']} MiB ({steady['rss_growth_pct']:+g} %), between "
            f"{steady['rss_min_mib']} and {steady['rss_max_mib']}, trend {steady['rss_trend_mib']:+g} MiB "
            f"({steady['rss_trend_pct']:+g} %) over the span; fds {steady['fds'][0]}-{steady['fds'][1]}, "
            f"threads {steady['threads'][0]}-{steady['threads'][1]}; {steady['late_over_1s']} late, "
            f"{steady['non_200']} non-200")


def markdown(results: dict[str, Any]) -> str:
    """The per-interval table and a line of context."""
    rows = [[r["end_s"] / 60, r["sent_rps"], r["p50_ms"], r["p99_ms"], r["late_over_1s"], r["non_200"],
             r["by_role"]["worker"]["rss_mib"], r["by_role"]["model"]["rss_mib"], r["by_role"]["master"]["rss_mib"],
             served(r, "fds"), served(r, "threads"), r["cache_entries"],
             r["model_share"], r["server_cpu_pct"], r["batch_ms_per_question"], r["model_answers_so_far"],
             f"{r['gc_full_collections']:.0f} ({r['gc_full_s']:.2f})"] for r in results["intervals"]]
    head = ("minute | req/s sent | p50 ms | p99 ms | late | non-200 | workers' RSS MiB | model procs' RSS MiB | "
            "master RSS MiB | fds | threads | cache entries | model share | server CPU % | batch ms per question | "
            "model answers so far | full GC collections (s)")
    pool = results["request_pool"]
    lists = (f"{pool['bodies']} distinct lists" if pool.get("distinct")
             else f"{pool['short']} short lists in {pool['bodies']}")
    lines = [f"soak: {results['share']:g} x {results['capacity_rps']} req/s (the model's answers/s at "
             f"{PROBE_CLIENTS} clients) = {results['rate_rps']} req/s for {results['minutes']:g} min, {lists}", "",
             f"Workers and model processes, {steady_line(results.get('steady_state'))}.", "",
             *table(head, [[round(v, 2) if isinstance(v, float) else v for v in row] for row in rows])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long to drive it (default 60)")
    parser.add_argument("--share", type=float, default=0.7,
                        help="the arrival rate as a share of the 64-client rate (default 0.7)")
    parser.add_argument("--short-share", type=float, default=0.3,
                        help="share of the requests that are short lists (default 0.3)")
    parser.add_argument("--capacity", type=float, default=None, metavar="RPS",
                        help="the 64-client rate, known already: no probe")
    parser.add_argument("--probe-s", type=float, default=20.0, help="seconds of the 64-client probe (default 20)")
    parser.add_argument("--interval-s", type=float, default=60.0, help="seconds between records (default 60)")
    parser.add_argument("--settle-minutes", type=float, default=10.0,
                        help="the first minutes the steady-state line leaves out (default 10)")
    parser.add_argument("--distinct", type=int, default=None, metavar="N",
                        help="N distinct lists simulated from the corpus's train and review sentences, each new to "
                             "the server until the pool wraps (instead of 1,000 real-shaped and short ones)")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting in the server's environment (repeatable), e.g. CACHE_SIZE=1000")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "soak",
                        help="where soak.json, soak.md and soak.png go")
    parser.add_argument("--fake", action="store_true",
                        help="serve tests/fakes.py's FakeCorrector: to smoke-test the tool; its figures mean nothing")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if not 0 < args.share <= 2 or not 0 <= args.short_share <= 1 or args.minutes <= 0 or args.interval_s <= 0 \
            or args.settle_minutes < 0 or (args.distinct is not None and args.distinct < 1):
        raise cli.ToolError("--share must be in (0, 2], --short-share in [0, 1], --minutes and --interval-s > 0, "
                            "--settle-minutes >= 0, --distinct >= 1")
    cli.require_weights(args.fake, missing_weights())
    pairs = [pair.partition("=") for pair in args.server_setting]
    if bad := next(("".join(p) for p in pairs if not p[0] or not p[1]), None):
        raise cli.ToolError(f"--server-setting wants NAME=VALUE, got {bad!r}")
    settings = {name: value for name, _, value in pairs}
    out: Path = args.out
    if args.distinct:  # as `testing.ab --fresh` serves them: the train and review sentences'
        pool = simulated_bodies(args.distinct, ("train", "reviews"), distinct=True)
        shape = {**pool_shape(pool), "distinct": True}
    else:
        pool, shape = request_pool(POOL, args.short_share)
    templates = payload_templates(pool)
    results: dict[str, Any] = {
        **run_record("soak", argv), "fake_corrector": args.fake, "minutes": args.minutes, "share": args.share,
        "interval_s": args.interval_s, "settings": settings, "request_pool": shape, "judge_timeout_s": JUDGE_TIMEOUT_S,
        "open_loop_timeout_s": OPEN_LOOP_ANSWER_S, "intervals": [],
    }
    with start_server({"LOG_LEVEL": "INFO", **settings}, app=FAKE_APP if args.fake else APP) as server:
        print(f"soak: server up, log {server.log_path}", flush=True)
        results["service"] = get_json(server.url + "/")
        results["processes_at_start"], results["gc_full_at_start"] = server.processes(), full_gc(server.url)
        capacity = args.capacity
        if capacity is None:  # distinct lists: the probe's from the pool's end, the intervals' from its start
            probe = measure_closed(server, PROBE_CLIENTS, args.probe_s, templates[::-1] if args.distinct else templates)
            probe.pop("_shots"), probe.pop("_start")
            results["probe"], capacity = probe, probe["model_rps"]
            print(f"soak: {PROBE_CLIENTS} clients: {capacity} model answers/s ({probe['throughput_rps']} answers/s,"
                  f" p99 {probe['p99_ms']} ms)", flush=True)
        results["capacity_rps"] = capacity
        results["rate_rps"] = rate = round(args.share * capacity, 2)
        started, sent = time.monotonic(), 0
        for index in range(max(1, round(args.minutes * 60 / args.interval_s))):
            record = run_interval(server, rate, args.interval_s, templates, index, sent)
            sent += record["requests"]
            record["end_s"] = round(time.monotonic() - started, 1)
            results["intervals"].append(record)
            roles = record["by_role"]
            print(f"soak: {record['end_s'] / 60:5.1f} min  {record['sent_rps']:7.1f} req/s  p50 {record['p50_ms']} "
                  f"p99 {record['p99_ms']} ms  late {record['late_over_1s']}  non-200 {record['non_200']}  RSS "
                  f"worker {roles['worker']['rss_mib']} model {roles['model']['rss_mib']} MiB  fds "
                  f"{roles['worker']['fds']}  threads {roles['worker']['threads']}  cache {record['cache_entries']}",
                  flush=True)
            write_json(out / "soak.json", results)
    results["took_s"] = round(time.monotonic() - started, 1)
    results["steady_state"] = steady_state(results["intervals"], 60 * args.settle_minutes)
    print(f"soak: {steady_line(results['steady_state'])}", flush=True)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["plots"] = draw_soak(results, out)
    write_summary(out, "soak", results, markdown(results))
    print(f"soak: wrote soak.json, soak.md and {', '.join(results['plots'])} to {out}")
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.soak")
