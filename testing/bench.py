"""The benchmark: the corrector's offline ceiling, then the served service under closed- and open-loop load.

    .venv/bin/python -m testing.bench [--sections a,b,c,d] [--duration S] [--quick] [--out docs/bench] [--profile]

Sections (each point runs `--duration` seconds after a short warm-up; defaults below keep the whole run under
about 12 minutes on 2 cores):

a. offline: the corrector alone (no HTTP), items/s by batch size 1..64 on the same inputs: the ceiling;
b. closed loop: 1, 10 and 64 clients (one thread and one requests.Session each, next request when the previous
   is answered), batching on (the defaults) and off (MAX_BATCH_SIZE=1: one corrector call per request);
c. open-loop overload: Poisson arrivals at 2x and 3x the capacity measured in b (batching on), each request
   on a thread of a large pool, latency counted from the scheduled send time;
d. batch policy: BATCH_POLICY=fixed vs adaptive, both servers up at once, latency at 1, 2, 4, 10, 64 clients
   (the policies alternate at each point) and throughput at 64 in 8 ABBA rounds, compared by median.

Every server is gunicorn started as `make run` starts it (testing/server.py), serving testing/bench_app.py:
the service's own app plus a read-only route with the batcher's counters (batches, padded waste). Answers are
counted by path from the server's own request log (stderr, one JSON line per request). The load generator runs
on the same machine as the server: on a small machine it takes CPU from the server, so the figures are a lower
bound of what the server alone could do.

Writes bench.json (summaries, machine, exact command), bench_raw.json (every request), bench.md (the tables
printed) and PNG plots into --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.bench"):
    import requests

    from config import Config
    from preprocess.text import NBest, han_only, strip_spaces
    from testing.bench_app import STATS_ROUTE
    from testing.samples import RESPONSE_KEYS, real_bodies
    from testing.server import REPO_ROOT, ServerProcess, missing_weights, start_server

JUDGE_TIMEOUT_S = 1.0
# Clients wait longer than the judge, to see how late a late answer is.
CLIENT_TIMEOUT_S = 5.0
# In the open loop a request still unanswered after the judge's relaxed timeout (2 s) has failed anyway; giving
# up then bounds the threads the load generator needs (rate x timeout).
OPEN_LOOP_TIMEOUT_S = 2.0
MAX_OPEN_LOOP_THREADS = 2048
UUID_MARK = "@@ESUN_UUID@@"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
SECTIONS = ("a", "b", "c", "d")
POLICIES = ("fixed", "adaptive")
# Per-point durations (s) of a default run; --duration replaces them all.
DEFAULT_DURATION_S = {"a": 2.0, "b": 10.0, "c": 10.0, "d": 15.0}
QUICK_DURATION_S = 3.0
SETTINGS_ON: dict[str, str] = {}
SETTINGS_OFF = {"MAX_BATCH_SIZE": "1"}


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def request_pool(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Return n request bodies: the real samples, then simulated n-best lists (preprocess.simulate) of test sentences.

    Only questions the model takes are kept (TOP1 has Han characters and at most max_top1_chars), so that every
    answer's path says something about the model and the batcher, not about the too-long guard.
    """
    limit = Config().max_top1_chars
    bodies = [body for body in real_bodies() if _model_takes(body["sentence_list"][0], limit)]
    corpus = REPO_ROOT / "data" / "corpus"
    _ensure_corpus(corpus)
    from preprocess.simulate import load_simulator

    simulator = load_simulator(corpus)
    sentences = [s for s in (corpus / "test.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    for sentence in sentences:
        if len(bodies) >= n:
            break
        nbest = simulator.simulate(sentence, rng, phones=True)
        if _model_takes(nbest.top1, limit):
            bodies.append({"esun_uuid": "", "esun_timestamp": 1656000000.5, "sentence_list": list(nbest.sentences),
                           "phoneme_sequence_list": list(nbest.phonemes), "retry": 2})
    return bodies[:n]


def _model_takes(top1: str, limit: int) -> bool:
    return bool(han_only(top1)) and len(strip_spaces(top1)) <= limit


def _ensure_corpus(corpus: Path) -> None:
    if (corpus / "lexicon.json").is_file() and (corpus / "test.txt").is_file():
        return
    print(f"bench: {corpus} is missing: building it (python -m preprocess.corpus)", flush=True)
    subprocess.run([sys.executable, "-m", "preprocess.corpus", "--out", str(corpus)], cwd=REPO_ROOT, check=True)


def payload_templates(bodies: list[dict[str, Any]]) -> list[str]:
    """Serialise each body once, with a mark where each request puts its own esun_uuid (client CPU is scarce)."""
    return [json.dumps({**body, "esun_uuid": UUID_MARK}, ensure_ascii=False) for body in bodies]


def fresh_payload(template: str) -> tuple[str, bytes]:
    """Return a new esun_uuid (64 hex, like the judge's) and the template's body under it."""
    esun_uuid = uuid.uuid4().hex + uuid.uuid4().hex
    return esun_uuid, template.replace(UUID_MARK, esun_uuid).encode("utf-8")


# ---------------------------------------------------------------------------------------------------------------
# Measurements


@dataclass
class Shot:
    """One request: when it was due and when it was sent (wall clock), how long from sending to its answer, the
    status (0: no answer within the client's timeout) and whether the answer was valid. In a closed loop a
    request is sent when due; in an open loop a busy load generator may send it late (`lag_s`)."""

    due: float
    latency_s: float
    status: int
    valid: bool
    lag_s: float = 0.0

    @property
    def done(self) -> float:
        return self.due + self.lag_s + self.latency_s


def latency_stats(latencies_s: list[float]) -> dict[str, float | None]:
    """Return p50/p95/p99/max/mean in milliseconds (None when there is no sample)."""
    if not latencies_s:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    ms = sorted(x * 1000 for x in latencies_s)

    def pct(q: float) -> float:
        # Nearest rank: a percentile is a latency some request really had.
        return round(ms[max(0, math.ceil(q / 100 * len(ms)) - 1)], 2)

    return {"p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99), "max_ms": round(ms[-1], 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


def count_paths(log: list[dict[str, Any]], start: float, end: float) -> Counter[str]:
    """Count the server's answers by path among the request-log lines stamped within [start, end] (wall clock)."""
    return Counter(line.get("path", "?") for line in log if start <= float(line.get("ts", 0)) <= end)


def server_latency(log: list[dict[str, Any]], start: float, end: float) -> dict[str, float | None]:
    """Return the p50/p99 the server itself logged (view entered to answer made) for lines within [start, end].

    Set beside the client's figures it tells where time went: a request waiting for a free gunicorn thread, or
    a load generator short of CPU, shows in the client's latency and not in this one.
    """
    stats = latency_stats([float(line["latency_ms"]) / 1000 for line in log
                           if start <= float(line.get("ts", 0)) <= end and "latency_ms" in line])
    return {"server_p50_ms": stats["p50_ms"], "server_p99_ms": stats["p99_ms"]}


def summarise(shots: list[Shot], window: tuple[float, float], paths: Counter[str],
              stats_delta: dict[str, int] | None) -> dict[str, Any]:
    """Summarise one point: throughput, latency percentiles, failures, lateness, paths and batching.

    Latencies are of the requests due within the window, from sending to answer (what the server is answerable
    for); throughput counts the 200 answers that arrived within the window.
    """
    start, end = window
    duration_s = end - start
    answered = [s for s in shots if s.status]
    out: dict[str, Any] = {
        "requests": len(shots),
        "throughput_rps": round(sum(1 for s in shots if s.status == 200 and start <= s.done < end) / duration_s, 2),
        # Answers the model made (not a TOP1 fallback or guard), from the server's log: the capacity that counts.
        "model_rps": round(paths.get("model", 0) / duration_s, 2),
        **latency_stats([s.latency_s for s in answered]),
        "non_200": sum(1 for s in shots if s.status != 200),
        "no_answer": sum(1 for s in shots if s.status == 0),
        "invalid": sum(1 for s in shots if s.status == 200 and not s.valid),
        "late_over_1s": sum(1 for s in shots if not s.status or s.latency_s > JUDGE_TIMEOUT_S),
        "paths": dict(sorted(paths.items())),
    }
    if stats_delta:
        batches, items = stats_delta.get("batches", 0), stats_delta.get("items", 0)
        out["batcher"] = {
            **stats_delta,
            "mean_batch_size": round(items / batches, 2) if batches else None,
            "padded_waste_per_item": round(stats_delta.get("padded_waste", 0) / items, 2) if items else None,
        }
    return out


class Client:
    """Sends one request and checks its answer; one per thread (its own keep-alive connection)."""

    def __init__(self, url: str, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/") + "/inference"
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.trust_env = False  # loopback: never through a proxy from the environment

    def send(self, template: str) -> tuple[int, bool]:
        """Post a fresh question; return (status, whether the answer is a valid four-key answer to it)."""
        esun_uuid, payload = fresh_payload(template)
        try:
            response = self.session.post(self.url, data=payload, timeout=self.timeout_s,
                                         headers={"Content-Type": "application/json"})
        except requests.RequestException:
            return 0, False
        try:
            data = response.json()
        except ValueError:
            return response.status_code, False
        valid = (isinstance(data, dict) and set(data) == RESPONSE_KEYS and data["esun_uuid"] == esun_uuid
                 and isinstance(data["answer"], str) and bool(data["answer"]))
        return response.status_code, valid

    def close(self) -> None:
        self.session.close()


def closed_loop(url: str, clients: int, duration_s: float, warmup_s: float,
                templates: list[str]) -> tuple[list[Shot], float, float]:
    """Run `clients` threads, each sending its next request when the previous is answered; return the shots due
    within the measured window (after the warm-up) and that window's wall-clock start and end."""
    stop = threading.Event()
    shots: list[list[Shot]] = [[] for _ in range(clients)]
    ready = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        client = Client(url)
        k = index * 7919  # each client walks the pool from its own place
        ready.wait()
        while not stop.is_set():
            due, started = time.time(), time.perf_counter()
            status, valid = client.send(templates[k % len(templates)])
            shots[index].append(Shot(due, time.perf_counter() - started, status, valid))
            k += 1
        client.close()


    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"client-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.time() + warmup_s
    time.sleep(warmup_s + duration_s)
    end = start + duration_s
    stop.set()
    for thread in threads:
        thread.join(CLIENT_TIMEOUT_S + 5)
    measured = [s for per in shots for s in per if start <= s.due < end]
    return measured, start, end


def open_loop(url: str, rate_rps: float, duration_s: float, warmup_s: float, templates: list[str],
              seed: int = 0) -> tuple[list[Shot], float, float, dict[str, Any]]:
    """Send Poisson arrivals at rate_rps, each on its own thread of a pool sized for rate x timeout, whatever the
    answers do; a request unanswered after OPEN_LOOP_TIMEOUT_S counts as no answer. Latency is from sending to
    answer; how late each request left behind its schedule (a saturated load generator) is kept apart as its lag.
    Return the shots due in the measured window, its start and end, and the load generator's own figures: rates
    scheduled and really sent, threads, requests never sent (still queued when the point ended)."""
    rng = random.Random(seed)
    local = threading.local()
    clients: list[Client] = []
    clients_lock = threading.Lock()
    shots: list[Shot] = []
    shots_lock = threading.Lock()

    def client() -> Client:
        if not hasattr(local, "client"):
            local.client = Client(url, OPEN_LOOP_TIMEOUT_S)
            with clients_lock:
                clients.append(local.client)
        return local.client

    def send(due_wall: float, due_perf: float, template: str) -> None:
        http = client()
        sent = time.perf_counter()
        status, valid = http.send(template)
        shot = Shot(due_wall, time.perf_counter() - sent, status, valid, lag_s=max(0.0, sent - due_perf))
        with shots_lock:
            shots.append(shot)

    total_s = warmup_s + duration_s
    dispatched = 0
    pool_size = min(MAX_OPEN_LOOP_THREADS, max(64, math.ceil(rate_rps * (OPEN_LOOP_TIMEOUT_S + 0.5))))
    pool = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="open-loop")
    t0_wall, t0_perf = time.time(), time.perf_counter()
    offset = rng.expovariate(rate_rps)
    while offset < total_s:
        delay = t0_perf + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        pool.submit(send, t0_wall + offset, t0_perf + offset, templates[dispatched % len(templates)])
        dispatched += 1
        offset += rng.expovariate(rate_rps)
    dispatch_s = time.perf_counter() - t0_perf
    # Requests still queued in the client when the point ends were never sent: drop them (counted as not sent)
    # rather than let a backlog drain for minutes; those on the wire get their answer or the client's timeout.
    pool.shutdown(wait=True, cancel_futures=True)
    for c in clients:
        c.close()
    start, end = t0_wall + warmup_s, t0_wall + total_s
    with shots_lock:
        measured = [s for s in shots if start <= s.due < end]
        not_sent = dispatched - len(shots)
        sent_in_window = sum(1 for s in shots if start <= s.due + s.lag_s < end)
    generator = {"scheduled_rps": round(dispatched / max(dispatch_s, 1e-9), 2),
                 "sent_rps": round(sent_in_window / duration_s, 2), "threads": pool_size, "not_sent": not_sent}
    return measured, start, end, generator


# ---------------------------------------------------------------------------------------------------------------
# Servers


class Servers:
    """The benchmark's gunicorn servers, one per settings, started on first use and stopped on release."""

    def __init__(self, log_dir: Path, fake: bool) -> None:
        self.log_dir = log_dir
        self.app = "testing.bench_app:create_bench_app(fake=True)" if fake else "testing.bench_app:create_bench_app()"
        self.running: dict[str, ServerProcess] = {}
        self.info: dict[str, Any] = {}

    def get(self, name: str, settings: dict[str, str]) -> ServerProcess:
        """Return the server of this name, starting it with these settings (env) if it is not running."""
        if name not in self.running:
            print(f"bench: starting server {name} {settings or '(defaults)'}", flush=True)
            env = {"LOG_LEVEL": "INFO", **settings}
            server = start_server(env, self.log_dir / f"server-{name}.log", app=self.app)
            self.running[name] = server
            with requests.Session() as http:
                http.trust_env = False
                self.info[name] = {"settings": settings, "service": http.get(server.url + "/", timeout=10).json()}
        return self.running[name]

    def release(self, name: str) -> None:
        """Stop the server of this name, if it runs."""
        server = self.running.pop(name, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        for name in list(self.running):
            self.release(name)


def batcher_stats(server: ServerProcess) -> dict[str, Any] | None:
    """Read the batcher's counters from the bench app's route (None if the server does not have it)."""
    with requests.Session() as http:
        http.trust_env = False
        try:
            response = http.get(server.url + STATS_ROUTE, timeout=5)
        except requests.RequestException:
            return None
    return response.json() if response.status_code == 200 else None


_COUNTERS = ("batches", "items", "failures", "dropped_expired", "overloaded", "padded_waste")


def stats_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int] | None:
    """Return how much each batcher counter grew between two snapshots."""
    if before is None or after is None:
        return None
    return {k: int(after[k]) - int(before[k]) for k in _COUNTERS if k in after and k in before}


def measure_closed(server: ServerProcess, clients: int, duration_s: float, templates: list[str]) -> dict[str, Any]:
    """Run one closed-loop point against a server and summarise it, with its raw shots."""
    warmup_s = min(1.0, duration_s / 5)
    before = batcher_stats(server)
    shots, start, end = closed_loop(server.url, clients, duration_s, warmup_s, templates)
    after = batcher_stats(server)
    log = server.request_log()
    return {"clients": clients, "duration_s": duration_s,
            **summarise(shots, (start, end), count_paths(log, start, end), stats_delta(before, after)),
            **server_latency(log, start, end), "_shots": shots, "_start": start}


def measure_open(server: ServerProcess, rate_rps: float, duration_s: float, templates: list[str]) -> dict[str, Any]:
    """Run one open-loop point against a server and summarise it, with its raw shots."""
    warmup_s = min(1.0, duration_s / 5)
    before = batcher_stats(server)
    shots, start, end, generator = open_loop(server.url, rate_rps, duration_s, warmup_s, templates)
    after = batcher_stats(server)
    # Answers may come up to the client timeout after the window: count their paths too.
    log = server.request_log()
    paths = count_paths(log, start, end + OPEN_LOOP_TIMEOUT_S)
    lags = latency_stats([s.lag_s for s in shots])
    if generator["sent_rps"] < 0.9 * rate_rps:
        print(f"bench c: the load generator put {generator['sent_rps']} req/s on the wire of the {rate_rps:.0f} "
              f"asked: it, not only the server, is saturated (it shares the machine)", flush=True)
    return {"target_rps": round(rate_rps, 2), **generator, "duration_s": duration_s,
            "client_lag_p50_ms": lags["p50_ms"], "client_lag_p99_ms": lags["p99_ms"],
            **summarise(shots, (start, end), paths, stats_delta(before, after)),
            **server_latency(log, start, end + OPEN_LOOP_TIMEOUT_S), "_shots": shots, "_start": start}


# ---------------------------------------------------------------------------------------------------------------
# Sections


@dataclass
class Plan:
    """What one run measures."""

    sections: tuple[str, ...]
    durations: dict[str, float]
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    b_clients: tuple[int, ...] = (1, 10, 64)
    c_factors: tuple[float, ...] = (2.0, 3.0)
    d_clients: tuple[int, ...] = (1, 2, 4, 10, 64)
    d_rounds: int = 8
    fake: bool = False
    profile: bool = False


def section_a(plan: Plan, pool: list[dict[str, Any]]) -> dict[str, Any]:
    """Offline: the corrector alone, items per second by batch size, the same inputs for every size."""
    corrector = _offline_corrector(plan.fake)
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
        waste = statistics.fmean(_padded_waste(batch) / len(batch) for batch in batches)
        rows.append({"batch_size": size, "items_per_s": round(done / elapsed, 1), "calls": calls,
                     "ms_per_call_p50": round(statistics.median(times) * 1000, 2),
                     "ms_per_item": round(elapsed / done * 1000, 3),
                     "padded_waste_per_item_arrival_order": round(waste, 2)})
        print(f"bench a: batch {size:>2}: {rows[-1]['items_per_s']:>8} items/s", flush=True)
    info = getattr(corrector, "info", {})
    return {"rows": rows, "ceiling_items_per_s": max(r["items_per_s"] for r in rows),
            "model": json.loads(json.dumps(dict(info), default=str)), "inputs": len(items),
            "torch_threads": _torch_threads()}


def _offline_corrector(fake: bool) -> Any:
    if fake:
        from testing.fakes import FakeCorrector

        return FakeCorrector(delay_s=0.005)
    from model.corrector import Corrector

    corrector = Corrector(device=Config.from_env().device)
    corrector.setup()
    return corrector


def _padded_waste(batch: list[NBest]) -> int:
    sizes = [len(strip_spaces(item.top1)) for item in batch]
    return max(sizes) * len(sizes) - sum(sizes)


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def section_b(plan: Plan, servers: Servers, templates: list[str], out: Path) -> dict[str, Any]:
    """Closed loop at 1, 10, 64 clients, batching on (the defaults) and off (MAX_BATCH_SIZE=1)."""
    result: dict[str, Any] = {}
    for mode, settings in (("on", SETTINGS_ON), ("off", SETTINGS_OFF)):
        server = servers.get(f"batching-{mode}", settings)
        points = []
        for clients in plan.b_clients:
            profiling = _start_profile(server, out, f"b-{mode}-{clients}", plan.durations["b"]) \
                if plan.profile and mode == "on" and clients == max(plan.b_clients) else None
            point = measure_closed(server, clients, plan.durations["b"], templates)
            _finish_profile(profiling)
            points.append(point)
            _print_point(f"b batching {mode}", f"{clients} clients", point)
        result[mode] = points
        if mode == "off":
            servers.release(f"batching-{mode}")
    # Capacity: the most model answers per second batching on made; TOP1 fallbacks are cheap and do not count.
    on = [p["model_rps"] for p in result["on"]]
    result["capacity_rps"] = max(on) if on else None
    return result


def section_c(plan: Plan, servers: Servers, templates: list[str], capacity_rps: float | None) -> dict[str, Any]:
    """Open-loop overload at 2x and 3x the capacity (batching on); capacity probed at 64 clients if b did not run."""
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
        _print_point("c overload", f"{factor:g}x = {point['target_rps']} req/s", point)
    return {"capacity_rps": capacity_rps, "points": points}


# Order of the throughput rounds at the most clients: ABBA cancels a linear drift of the shared machine.
ABBA = (0, 1, 1, 0)


def section_d(plan: Plan, servers: Servers, templates: list[str]) -> dict[str, Any]:
    """Batch policy fixed vs adaptive, both servers up at once: latency by clients (the policies alternate at each
    point), then throughput at the most clients in `d_rounds` ABBA rounds, compared by median."""
    # Fresh servers for both policies: the batching-on server of b and c may still be busy with the overload's
    # abandoned requests, which would handicap whichever policy it serves.
    servers.release("batching-on")
    names = {policy: f"policy-{policy}" for policy in POLICIES}
    running = {policy: servers.get(name, {"BATCH_POLICY": policy}) for policy, name in names.items()}
    result: dict[str, Any] = {policy: [] for policy in POLICIES}
    for clients in plan.d_clients:
        for policy in POLICIES:
            point = measure_closed(running[policy], clients, plan.durations["d"], templates)
            result[policy].append(point)
            _print_point(f"d {policy}", f"{clients} clients", point)
    most = max(plan.d_clients)
    rounds: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    for i in range(plan.d_rounds):
        policy = POLICIES[ABBA[i % len(ABBA)]]
        point = measure_closed(running[policy], most, plan.durations["d"], templates)
        rounds[policy].append(point["throughput_rps"])
        _print_point(f"d round {i + 1} {policy}", f"{most} clients", point)
    medians = {policy: statistics.median(r) if r else None for policy, r in rounds.items()}
    ratio = medians["adaptive"] / medians["fixed"] if medians["adaptive"] and medians["fixed"] else None
    result["throughput_rounds"] = {"clients": most, "rounds": rounds, "median_rps": medians,
                                   "adaptive_over_fixed": None if ratio is None else round(ratio, 3)}
    for name in names.values():
        servers.release(name)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Profiling (optional)


def _start_profile(server: ServerProcess, out: Path, label: str, duration_s: float) -> subprocess.Popen | None:
    """Sample the server with py-spy during one point, if py-spy is installed; write a flame graph SVG."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("bench: --profile needs py-spy (make install-dev installs it); not profiling", flush=True)
        return None
    target = out / f"profile-{label}.svg"
    print(f"bench: profiling the server with py-spy into {target}", flush=True)
    # --nonblocking and no --idle: pausing 130 threads 100 times a second collapsed the server being measured,
    # and idle frames (threads waiting on the batcher) hid where the CPU goes.
    return subprocess.Popen([py_spy, "record", "--pid", str(server.process.pid), "--subprocesses", "--nonblocking",
                             "--duration", str(math.ceil(duration_s + 1)), "--rate", "50", "-o", str(target)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _finish_profile(process: subprocess.Popen | None) -> None:
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)


# ---------------------------------------------------------------------------------------------------------------
# Reports


def _print_point(section: str, label: str, p: dict[str, Any]) -> None:
    print(f"bench {section}, {label}: {p['throughput_rps']} req/s, p50 {p['p50_ms']} p99 {p['p99_ms']} "
          f"max {p['max_ms']} ms, non-200 {p['non_200']}, late {p['late_over_1s']}, paths {p['paths']}", flush=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _paths_text(paths: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in paths.items()) or "-"


def markdown(results: dict[str, Any]) -> str:
    """Render the results as markdown tables."""
    lines: list[str] = []
    machine = results["machine"]
    lines += ["## Machine", "", f"- CPU: {machine['cpu_model']} ({machine['logical_cpus']} logical CPUs, "
              f"{machine['physical_cores']} cores), RAM {machine['ram_gib']} GiB, load average at start "
              f"{machine['load_average_at_start']}, at end {machine.get('load_average_at_end')}",
              f"- Command: `{results['command']}`",
              f"- Started {results['started_utc']}, took {results['took_s']} s", ""]
    if "a" in results:
        a = results["a"]
        lines += ["## a. Offline corrector throughput (the ceiling)", "",
                  "| batch size | items/s | ms per call (p50) | ms per item | padded chars per item |",
                  "|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['batch_size']} | {r['items_per_s']} | {r['ms_per_call_p50']} | {r['ms_per_item']} | "
                  f"{r['padded_waste_per_item_arrival_order']} |" for r in a["rows"]]
        lines += ["", f"Ceiling: {a['ceiling_items_per_s']} items/s ({a['inputs']} inputs, torch threads "
                  f"{a['torch_threads']}).", ""]
    if "b" in results:
        lines += ["## b. Closed loop (batching on = defaults, off = MAX_BATCH_SIZE=1)", "",
                  "| batching | clients | req/s | model req/s | p50 ms | p95 ms | p99 ms | max ms | server p99 ms | "
                  "non-200 | late > 1 s | mean batch | answers by path |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for mode in ("on", "off"):
            for p in results["b"].get(mode, []):
                lines.append(_row(mode, p["clients"], p))
        lines += ["", f"Capacity (batching on, most model answers/s of the points): "
                  f"{_fmt(results['b'].get('capacity_rps'))} req/s.", ""]
    if "c" in results:
        c = results["c"]
        lines += [f"## c. Open-loop overload (Poisson arrivals; capacity {_fmt(c['capacity_rps'])} req/s)", "",
                  "| load | target req/s | sent req/s | answered req/s | p50 ms | p99 ms | max ms | server p99 ms | "
                  "non-200 | no answer (> 2 s) | late > 1 s | client lag p99 ms | not sent | answers by path |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for p in c["points"]:
            lines.append(f"| {p['factor']:g}x | {p['target_rps']} | {p['sent_rps']} | {p['throughput_rps']} | "
                         f"{_fmt(p['p50_ms'])} | {_fmt(p['p99_ms'])} | {_fmt(p['max_ms'])} | "
                         f"{_fmt(p['server_p99_ms'])} | {p['non_200']} | {p['no_answer']} | "
                         f"{p['late_over_1s']} of {p['requests']} | "
                         f"{_fmt(p['client_lag_p99_ms'])} | {p['not_sent']} | {_paths_text(p['paths'])} |")
        lines += ["", "Latency is from sending to answer, as the client saw it; server p99 is what the server logged "
                  "(view entered to answer made), without the wait for a free gunicorn thread; client lag is how "
                  "late the load generator sent a request after its scheduled time (it shares the machine with the "
                  "server); not sent: requests still queued in the generator when the point ended.", ""]
    if "d" in results:
        lines += ["## d. Batch policy: fixed vs adaptive", "",
                  "| policy | clients | req/s | model req/s | p50 ms | p95 ms | p99 ms | max ms | server p99 ms | "
                  "non-200 | late > 1 s | mean batch | answers by path |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for policy in POLICIES:
            for p in results["d"].get(policy, []):
                lines.append(_row(policy, p["clients"], p))
        lines += ["", "| policy | clients | batches | mean batch | padded chars per item (TOP1, spaces removed) |",
                  "|---|---:|---:|---:|---:|"]
        for policy in POLICIES:
            for p in results["d"].get(policy, []):
                b = p.get("batcher") or {}
                lines.append(f"| {policy} | {p['clients']} | {_fmt(b.get('batches'))} | "
                             f"{_fmt(b.get('mean_batch_size'))} | {_fmt(b.get('padded_waste_per_item'))} |")
        tr = results["d"].get("throughput_rounds")
        if tr:
            lines += ["", f"Throughput at {tr['clients']} clients, ABBA rounds (answers/s):", "",
                      "| policy | rounds | median |", "|---|---|---:|"]
            for policy in POLICIES:
                lines.append(f"| {policy} | {', '.join(_fmt(x) for x in tr['rounds'][policy])} | "
                             f"{_fmt(tr['median_rps'][policy])} |")
            lines += ["", f"Adaptive over fixed (medians): {_fmt(tr['adaptive_over_fixed'])}."]
        lines.append("")
    return "\n".join(lines)


def _row(name: str, clients: int, p: dict[str, Any]) -> str:
    batch = (p.get("batcher") or {}).get("mean_batch_size")
    return (f"| {name} | {clients} | {p['throughput_rps']} | {p['model_rps']} | {_fmt(p['p50_ms'])} | "
            f"{_fmt(p['p95_ms'])} | {_fmt(p['p99_ms'])} | {_fmt(p['max_ms'])} | {_fmt(p.get('server_p99_ms'))} | "
            f"{p['non_200']} | "
            f"{p['late_over_1s']} of {p['requests']} | {_fmt(batch)} | {_paths_text(p['paths'])} |")


def plots(results: dict[str, Any], raw: dict[str, list[list[float]]], out: Path) -> list[str]:
    """Draw the PNG plots; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    if "a" in results:
        rows = results["a"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["batch_size"] for r in rows], [r["items_per_s"] for r in rows], marker="o")
        ax.set(xscale="log", xlabel="batch size", ylabel="items/s", title="a. Offline corrector throughput")
        ax.set_xticks([r["batch_size"] for r in rows], [str(r["batch_size"]) for r in rows])
        ax.grid(alpha=0.3)
        save(fig, "a_offline_throughput_by_batch_size.png")

    over_time = [(key, series) for key, series in raw.items() if key.startswith(("b/", "c/"))]
    if over_time:
        groups = list(dict.fromkeys(key.split("/")[0] + "/" + key.split("/")[1] for key, _ in over_time))
        fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.2 * len(groups)), squeeze=False)
        for ax, group in zip(axes[:, 0], groups, strict=True):
            for key, series in over_time:
                if key.startswith(group + "/") and series:
                    ax.scatter([s[0] for s in series], [s[1] for s in series], s=3, alpha=0.5,
                               label=key.split("/", 2)[2])
            ax.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linewidth=0.8, linestyle="--", label="judge timeout")
            ax.set(xlabel="seconds into the point", ylabel="response time (ms)", yscale="log",
                   title=f"Response time over time: {group.replace('/', ', ')}")
            ax.legend(markerscale=4, fontsize=8)
            ax.grid(alpha=0.3)
        save(fig, "response_time_over_time.png")

    if "b" in results:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for mode in ("on", "off"):
            points = results["b"].get(mode, [])
            xs = [p["clients"] for p in points]
            left.plot(xs, [p["throughput_rps"] for p in points], marker="o", label=f"batching {mode}")
            right.plot(xs, [p["p99_ms"] or float("nan") for p in points], marker="o", label=f"batching {mode}")
        if "a" in results:
            left.axhline(results["a"]["ceiling_items_per_s"], color="grey", linestyle=":", label="offline ceiling")
        right.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linestyle="--", linewidth=0.8, label="judge timeout")
        left.set(xscale="log", xlabel="clients", ylabel="answers/s", title="b. Throughput by clients")
        right.set(xscale="log", yscale="log", xlabel="clients", ylabel="p99 latency (ms)", title="b. p99 by clients")
        ticks = sorted({p["clients"] for mode in ("on", "off") for p in results["b"].get(mode, [])})
        for ax in (left, right):
            ax.set_xticks(ticks, [str(x) for x in ticks])
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        save(fig, "b_throughput_and_p99_by_clients.png")

    if "d" in results:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for policy, color in (("fixed", "C0"), ("adaptive", "C1")):
            points = results["d"].get(policy, [])
            xs = [p["clients"] for p in points]
            for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
                left.plot(xs, [p[key] or float("nan") for p in points], style, marker="o", color=color,
                          label=f"{policy} {key[:3]}")
            rounds = (results["d"].get("throughput_rounds") or {}).get("rounds", {}).get(policy)
            if rounds:
                right.bar(policy, statistics.median(rounds), color=color)
                right.plot([policy] * len(rounds), rounds, "k.", label=None)
            else:
                right.bar(policy, points[-1]["throughput_rps"] if points else 0, color=color)
        left.set(xscale="log", yscale="log", xlabel="clients", ylabel="latency (ms)",
                 title="d. Latency by clients, fixed vs adaptive")
        ticks = sorted({p["clients"] for policy in POLICIES for p in results["d"].get(policy, [])})
        left.set_xticks(ticks, [str(x) for x in ticks])
        left.legend(fontsize=8)
        left.grid(alpha=0.3)
        top = max(results["d"]["fixed"][-1]["clients"] if results["d"].get("fixed") else 0,
                  results["d"]["adaptive"][-1]["clients"] if results["d"].get("adaptive") else 0)
        right.set(ylabel="answers/s", title=f"d. Throughput at {top} clients (median, dots: rounds)")
        save(fig, "d_policy_latency_by_clients.png")
    return written


# ---------------------------------------------------------------------------------------------------------------
# The run


def machine_info() -> dict[str, Any]:
    """Describe the machine: CPU model, cores, RAM, load, software versions."""
    import psutil

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


def _raw_series(point: dict[str, Any]) -> list[list[float]]:
    """Return [seconds into the point (due), latency ms, status, valid, client lag ms] for each request of a point,
    removing the shots from the point."""
    shots: list[Shot] = point.pop("_shots")
    start: float = point.pop("_start")
    return [[round(s.due - start, 4), round(s.latency_s * 1000, 2), s.status, int(s.valid), round(s.lag_s * 1000, 2)]
            for s in sorted(shots, key=lambda s: s.due)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testing.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="a,b,c,d", help="which sections to run, e.g. b,c (default a,b,c,d)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds measured per point, for every section (default a 2, b 10, c 10, d 15)")
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer points, {QUICK_DURATION_S:g} s each: a smoke run of the whole benchmark")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench", help="where results go")
    parser.add_argument("--profile", action="store_true",
                        help="sample the server with py-spy at the most clients of b (batching on), if installed")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs in OUT/logs")
    parser.add_argument("--fake", action="store_true",
                        help="serve testing/fakes.py's FakeCorrector instead of the shipped model (smoke runs only: "
                             "its figures mean nothing)")
    parser.add_argument("--pool", type=int, default=400, help="how many different request bodies (default 400)")
    return parser


def make_plan(args: argparse.Namespace) -> Plan:
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}: choose from {','.join(SECTIONS)}")
    duration = args.duration if args.duration is not None else (QUICK_DURATION_S if args.quick else None)
    durations = {s: duration if duration is not None else DEFAULT_DURATION_S[s] for s in SECTIONS}
    if args.quick:
        durations["a"] = min(durations["a"], 1.0)
        return Plan(sections, durations, batch_sizes=(1, 8, 64), b_clients=(1, 10, 64), c_factors=(2.0,),
                    d_clients=(1, 10, 64), d_rounds=2, fake=args.fake, profile=args.profile)
    return Plan(sections, durations, fake=args.fake, profile=args.profile)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    plan = make_plan(args)
    if not args.fake and (missing := missing_weights()):
        print(f"bench: model/weights/ lacks {', '.join(missing)}: train the model first (make train)", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict[str, Any] = {
        "command": shlex.join([Path(sys.executable).relative_to(REPO_ROOT).as_posix()
                               if Path(sys.executable).is_relative_to(REPO_ROOT) else sys.executable,
                               "-m", "testing.bench", *argv]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": machine_info(),
        "fake_corrector": plan.fake,
        "durations_s": {s: plan.durations[s] for s in plan.sections},
        "judge_timeout_s": JUDGE_TIMEOUT_S,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "open_loop_timeout_s": OPEN_LOOP_TIMEOUT_S,
    }
    if plan.fake:
        print("bench: serving a FakeCorrector (--fake): the figures say nothing about the model", flush=True)
    busy = os.getloadavg()[0]
    if busy > 0.5 * (os.cpu_count() or 1):
        # torch's worker threads spin: another CPU-heavy process (a training, a test run) slows the model many
        # times over, and the figures with it.
        print(f"bench: WARNING: load average {busy:.2f} on {os.cpu_count()} CPUs: the machine is busy, the figures "
              f"will be low; run the benchmark on an idle machine", file=sys.stderr, flush=True)
    pool = request_pool(args.pool)
    templates = payload_templates(pool)
    results["request_pool"] = {"bodies": len(pool), "real": len(real_bodies()),
                               "mean_top1_chars": round(statistics.fmean(
                                   len(strip_spaces(b["sentence_list"][0])) for b in pool), 1),
                               "mean_hypotheses": round(statistics.fmean(len(b["sentence_list"]) for b in pool), 1)}
    raw: dict[str, list[list[float]]] = {}
    log_dir = out / "logs" if args.keep_logs else Path(tempfile.mkdtemp(prefix="esun-bench-"))
    servers = Servers(log_dir, plan.fake)
    try:
        if "a" in plan.sections:
            results["a"] = section_a(plan, pool)
        if "b" in plan.sections:
            results["b"] = section_b(plan, servers, templates, out)
            for mode in ("on", "off"):
                for p in results["b"][mode]:
                    raw[f"b/batching {mode}/{p['clients']} clients"] = _raw_series(p)
        if "c" in plan.sections:
            capacity = results.get("b", {}).get("capacity_rps")
            results["c"] = section_c(plan, servers, templates, capacity)
            for p in results["c"]["points"]:
                raw[f"c/overload/{p['factor']:g}x"] = _raw_series(p)
        if "d" in plan.sections:
            results["d"] = section_d(plan, servers, templates)
            for policy in POLICIES:
                for p in results["d"][policy]:
                    raw[f"d/{policy}/{p['clients']} clients"] = _raw_series(p)
        results["servers"] = servers.info
    finally:
        servers.close()
        if not args.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    results["took_s"] = round(time.time() - started, 1)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["plots"] = plots(results, raw, out)
    (out / "bench.json").write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "bench_raw.json").write_text(json.dumps(raw, separators=(",", ":")) + "\n", encoding="utf-8")
    text = markdown(results)
    (out / "bench.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"bench: wrote bench.json, bench_raw.json, bench.md and {len(results['plots'])} plot(s) to {out}")
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.bench")
