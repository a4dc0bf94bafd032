"""Load generation for the benchmark (testing/bench.py) and the soak run (testing/soak.py).

One `Shot` per request, one `Client` that sends a question and checks its answer, and the loops that send:
`closed_loop` (each client sends its next request when the previous is answered), `open_loop` (Poisson arrivals,
whatever the answers do) and `fixed_rate` (evenly spaced arrivals for minutes). What the shots add up to is
testing/report.py's; the pictures are testing/plots.py's.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from testing.samples import RESPONSE_KEYS, check_answer, with_fresh_uuid

JUDGE_TIMEOUT_S = 1.0
# Clients wait longer than the judge, to see how late a late answer is.
CLIENT_TIMEOUT_S = 5.0
# In the open loop a request still unanswered after the judge's relaxed timeout (2 s) has failed anyway; giving
# up then bounds the threads the load generator needs (rate x timeout).
OPEN_LOOP_TIMEOUT_S = 2.0
MAX_OPEN_LOOP_THREADS = 2048
UUID_MARK = "@@ESUN_UUID@@"


@dataclass(frozen=True)
class Shot:
    """One request: when it was due, how long it took, the status (0: no answer within the client's timeout),
    what is wrong with the answer (None for a valid one) and how late the load generator sent it (`lag_s`); the
    `esun_uuid` it went out under and, once read from the server's request log (`testing.report.tag_paths`), the
    `path` the server answered it by (`model`, `deadline`, `overload`, ...; None while unknown).

    The benchmark stamps `due` with the wall clock; its threads time from sending, testing/aioload.py's open loop
    times from `due` (`from_due`, the lag included), as the soak run does (which stamps `due` in seconds into the
    run), so that a queue, or a generator falling behind, shows as latency.
    """

    due: float
    latency_s: float
    status: int
    problem: str | None
    lag_s: float = 0.0
    esun_uuid: str = ""
    path: str | None = None
    from_due: bool = False

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def done(self) -> float:
        return self.due + self.latency_s if self.from_due else self.due + self.lag_s + self.latency_s


def four_keys_problem(status: int, data: object, sent_uuid: str) -> str | None:
    """Say whether an answer is a four-key answer to this question (the benchmark's check: client CPU is scarce)."""
    valid = (isinstance(data, dict) and set(data) == RESPONSE_KEYS and data["esun_uuid"] == sent_uuid
             and isinstance(data["answer"], str) and bool(data["answer"]))
    return None if valid else "not a four-key answer to this question"


class Client:
    """Sends questions to /inference and checks each answer; thread-safe (one connection per thread).

    `keep_alive=False` asks for a fresh connection per request, as the judge's client does; `check` says what is
    wrong with an answer: `four_keys_problem` (the benchmark's, cheap) or `check_answer` (the judge's every rule).
    """

    def __init__(self, url: str, timeout_s: float = CLIENT_TIMEOUT_S, keep_alive: bool = True,
                 check: Callable[[int, object, str], str | None] = four_keys_problem) -> None:
        self.url = url.rstrip("/") + "/inference"
        self.timeout_s = timeout_s
        self.keep_alive = keep_alive
        self.check = check
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    def send(self, template: str) -> tuple[int, str | None]:
        """Post a fresh question from a payload template; return the status and what is wrong with the answer."""
        return self.send_fresh(template)[1:]

    def send_fresh(self, template: str) -> tuple[str, int, str | None]:
        """Like `send`, also returning the esun_uuid the question went out under (to find its path in the log)."""
        esun_uuid, payload = fresh_payload(template)
        return (esun_uuid, *self._post(esun_uuid, data=payload, headers={"Content-Type": "application/json"}))

    def send_body(self, body: dict[str, Any]) -> tuple[int, str | None]:
        """Post one body as it is; return the status (0 when none came) and what is wrong with the answer."""
        return self._post(body["esun_uuid"], json=body, headers={})

    def close(self) -> None:
        """Close every connection this client opened, on any thread."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False  # loopback: never through a proxy from the environment
            with self._lock:
                self._sessions.append(session)
        return session

    def _post(self, esun_uuid: str, headers: dict[str, str], **body: Any) -> tuple[int, str | None]:
        if not self.keep_alive:
            headers = {**headers, "Connection": "close"}
        try:
            response = self._session().post(self.url, timeout=self.timeout_s, headers=headers, **body)
        except requests.RequestException as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            data = response.json()
        except ValueError:
            data = response.text[:200]
        return response.status_code, self.check(response.status_code, data, esun_uuid)


def judge_client(url: str) -> Client:
    """Build a client like the judge's: a fresh connection per request, every rule of the contract checked."""
    return Client(url, keep_alive=False, check=check_answer)


def payload_templates(bodies: list[dict[str, Any]]) -> list[str]:
    """Serialise each body once, with a mark where each request puts its own esun_uuid (client CPU is scarce)."""
    return [json.dumps({**body, "esun_uuid": UUID_MARK}, ensure_ascii=False) for body in bodies]


def fresh_payload(template: str) -> tuple[str, bytes]:
    """Return a new esun_uuid (64 hex, like the judge's) and the template's body under it."""
    esun_uuid = uuid.uuid4().hex + uuid.uuid4().hex
    return esun_uuid, template.replace(UUID_MARK, esun_uuid).encode("utf-8")


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
            esun_uuid, status, problem = client.send_fresh(templates[k % len(templates)])
            shots[index].append(Shot(due, time.perf_counter() - started, status, problem, esun_uuid=esun_uuid))
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
        esun_uuid, status, problem = http.send_fresh(template)
        shot = Shot(due_wall, time.perf_counter() - sent, status, problem, lag_s=max(0.0, sent - due_perf),
                    esun_uuid=esun_uuid)
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


def fixed_rate(client: Client, bodies: list[dict[str, Any]], rate_per_s: float, seconds: float,
         on_progress: Callable[[float, int], None]) -> tuple[list[Shot], float]:
    """Send at a fixed rate for `seconds`, whatever the answers do; return every shot and the monotonic start.

    Each shot's `due` is in seconds into the run, and its latency counts from then (its lag included): the soak's
    question is whether the service keeps up, load generator and all.
    """
    shots: list[Shot] = []
    lock = threading.Lock()
    started = time.monotonic()

    def send(index: int, due: float) -> None:
        lag = max(0.0, time.monotonic() - due)
        body = with_fresh_uuid(bodies[index % len(bodies)])
        status, problem = client.send_body(body)
        shot = Shot(due - started, time.monotonic() - due, status, problem, lag_s=lag, esun_uuid=body["esun_uuid"])
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
    return sorted(shots, key=lambda s: s.due), started
