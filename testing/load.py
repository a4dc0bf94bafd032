"""The load-generator core every tool drives the service with: one `Shot` per request, payloads each under a fresh
esun_uuid, the one HTTP answer parser and percentile, the open loop (Poisson arrivals, latency from each request's
due time) and the closed loop (N clients, each asking again once answered), both on one asyncio (uvloop) event loop
with keep-alive connections and no thread, task or stream per request: the server shares the machine."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from testing.samples import check_answer
from testing.shots import LoadRun, Shot

JUDGE_TIMEOUT_S = 1.0
# Clients wait longer than the judge, to see how late a late answer is.
CLIENT_TIMEOUT_S = 5.0
UUID_MARK = "@@ESUN_UUID@@"
# How a Shot's problem starts when no answer came: its connection failed, or nothing came in the client's timeout.
CONNECTION_PROBLEM = "connection: "
TIMEOUT_PROBLEM = "timeout: "
# Well below gunicorn's keepalive (server/gunicorn_conf.py: 75 s), as nginx's upstream keepalive_timeout (4 s) is.
IDLE_CLOSE_S = 4.0
# How often the watchdog looks for requests past their timeout (and a closed loop for its stop).
WATCHDOG_S = 0.05
# The schedule sleeps at least this long between sends (what is due meanwhile leaves together, its lag recorded):
# a shorter sleep is a spin on uvloop, whose timers count whole milliseconds.
MIN_SLEEP_S = 0.001
MAX_HEADER_BYTES = 64 * 1024  # an answer to /inference is a few hundred bytes: a longer header block is not one

try:
    import uvloop

    _loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:
    _loop_factory = None
LOOP_NAME = "asyncio" if _loop_factory is None else "uvloop"


def payload_templates(bodies: list[dict[str, Any]]) -> list[str]:
    """Serialise each body once, with a mark where each request puts its own esun_uuid (client CPU is scarce)."""
    return [json.dumps({**body, "esun_uuid": UUID_MARK}, ensure_ascii=False) for body in bodies]


def fresh_payload(template: str) -> tuple[str, bytes]:
    """Return a new esun_uuid (64 hex, like the judge's) and the template's body under it."""
    esun_uuid = uuid.uuid4().hex + uuid.uuid4().hex
    return esun_uuid, template.replace(UUID_MARK, esun_uuid).encode("utf-8")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the q-th percentile (nearest rank: a latency some request really had) of values, None when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))] if ordered else None


@dataclass
class Target:
    """Where requests go: host and port, from a base URL."""

    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs are supported, got {url!r}")
        return cls(parts.hostname, parts.port or 80)

    def request(self, payload: bytes) -> bytes:
        """Return the whole POST /inference request for a JSON body."""
        return (f"POST /inference HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode("ascii") + payload


@dataclass(frozen=True)
class Answer:
    """One parsed HTTP answer: status, body, and whether the server keeps the connection open."""

    status: int
    body: bytes
    keep_alive: bool


def parse_answer(buffer: bytearray, closed: bool = False) -> tuple[Answer, int] | None:
    """Parse one HTTP/1.1 answer at the start of buffer; return it and its length, None while incomplete (`closed`:
    a body without a length ends here). ValueError if it is not HTTP, or chunked (the service sends a length).
    By hand, not h11: h11 took 51 µs per request, this 3.6 µs, on the generator's share of the machine."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise ValueError("header block too long")
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP status line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    keep_alive = headers.get("connection") != "close" and parts[0] == "HTTP/1.1"
    start = end + 4
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(buffer) < start + length:
            return None
        return Answer(int(parts[1]), bytes(buffer[start:start + length]), keep_alive), start + length
    if "transfer-encoding" in headers:
        raise ValueError("a chunked answer: the service sends a Content-Length")
    if not closed:
        return None
    return Answer(int(parts[1]), bytes(buffer[start:]), False), len(buffer)


@dataclass(slots=True)
class Request:
    """One request in flight: when it was due and when it left (time.monotonic()), its esun_uuid and body's index."""

    due: float
    sent: float
    esun_uuid: str
    question: int


class Connection(asyncio.Protocol):
    """One keep-alive connection: carries one request at a time and parses its answer as the bytes come."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.request: Request | None = None
        self.idle_since = 0.0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: Request, data: bytes) -> None:
        assert self.transport is not None
        self.request = request
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.request is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.close()
            return
        try:
            parsed = parse_answer(self.buffer)
        except ValueError as exc:
            self.end(f"{CONNECTION_PROBLEM}{exc}")
            return
        if parsed is not None:
            del self.buffer[:parsed[1]]
            if not parsed[0].keep_alive:
                self.close()
            self.end(answer=parsed[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.request is not None:
            try:
                parsed = parse_answer(self.buffer, closed=True)
            except ValueError:
                parsed = None
            if parsed is not None:
                self.end(answer=parsed[0])
            else:
                self.end(CONNECTION_PROBLEM + (type(exc).__name__ if exc is not None else
                                               "cut mid-answer" if self.buffer else "closed before answering"))

    def end(self, problem: str | None = None, answer: Answer | None = None) -> None:
        """Hand the request in flight back answered, or failed with `problem` (and drop a connection that failed)."""
        request, self.request = self.request, None
        if answer is None:
            self.close()
        if request is not None:
            self.generator.finish(request, answer, problem, self)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Generator:
    """The shots, the idle connections, the requests in flight, and the target's bytes."""

    def __init__(self, target: Target, templates: list[str], timeout_s: float, answers: bool = False) -> None:
        self.target = target
        self.templates = templates
        self.timeout_s = timeout_s
        self.answers = answers
        self.loop = asyncio.get_running_loop()
        self.t0 = time.monotonic()  # not the loop's clock: uvloop's counts whole ms, read once an iteration
        self.t0_wall = time.time()
        self.shots: list[Shot] = []
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self.opening = self.opened = self.reused = 0  # connections being opened, opened, and reused
        self.after_shot: Callable[[], None] | None = None  # a closed loop's next request, once one has ended

    def send(self, due: float, index: int) -> None:
        """Send the request due at `due` (loop clock) on an idle connection, or a new one."""
        question = index % len(self.templates)
        esun_uuid, payload = fresh_payload(self.templates[question])
        now = time.monotonic()
        request = Request(due, now, esun_uuid, question)
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to be closing
            if not conn.closed and now - conn.idle_since < IDLE_CLOSE_S:
                self.reused += 1
                self.busy.add(conn)
                conn.send(request, self.target.request(payload))
                return
            conn.close()
        self.opening += 1
        self.loop.create_task(self._open_and_send(request, self.target.request(payload)))

    async def _open_and_send(self, request: Request, data: bytes) -> None:
        # The request's timeout covers opening its connection: a server whose listen queue is full leaves a
        # connect waiting on the kernel's SYN retries for tens of seconds.
        try:
            async with asyncio.timeout(request.due + self.timeout_s - time.monotonic()):
                _, conn = await self.loop.create_connection(lambda: Connection(self), self.target.host,
                                                            self.target.port)
        except (OSError, TimeoutError) as exc:
            self.opening -= 1
            self.finish(request, None, f"{TIMEOUT_PROBLEM}no connection in time" if isinstance(exc, TimeoutError)
                        else f"{CONNECTION_PROBLEM}{type(exc).__name__}")
            return
        self.opening -= 1
        self.opened += 1
        self.busy.add(conn)
        request.sent = time.monotonic()
        conn.send(request, data)

    def finish(self, request: Request, answer: Answer | None, problem: str | None,
               conn: Connection | None = None) -> None:
        """Record one request's shot; an answered connection goes back to the idle ones."""
        self.busy.discard(conn)  # type: ignore[arg-type]
        status, text = 0, None
        if answer is not None:
            status, problem = answer.status, check_answer(answer.status, answer.body, request.esun_uuid)
            text = json.loads(answer.body)["answer"] if self.answers and problem is None else None
            if conn is not None and not conn.closed:
                conn.idle_since = time.monotonic()
                self.idle.append(conn)
        self.shots.append(Shot(self.t0_wall + (request.due - self.t0), time.monotonic() - request.due, status, problem,
                               lag_s=max(0.0, request.sent - request.due), esun_uuid=request.esun_uuid,
                               question=request.question, answer=text))
        if self.after_shot is not None:  # soon, not now: an answered connection goes back to the idle ones first
            self.loop.call_soon(self.after_shot)

    async def run(self, schedule: Coroutine[Any, Any, float], warmup_s: float, name: str) -> LoadRun:
        """Run the schedule (it returns when its window ends), then wait out every request in flight, each ended by
        its answer or, by the watchdog, at its timeout; return the window's shots."""

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(WATCHDOG_S)
                now = time.monotonic()
                for conn in [c for c in self.busy if c.request and c.request.due + self.timeout_s <= now]:
                    conn.end(f"{TIMEOUT_PROBLEM}no answer within {self.timeout_s:g} s")

        dog = self.loop.create_task(watchdog())
        try:
            end = await schedule
            while self.busy or self.opening:
                await asyncio.sleep(WATCHDOG_S)
        finally:
            dog.cancel()
            for conn in [*self.idle, *self.busy]:
                conn.close()
        start, end_wall = self.t0_wall + warmup_s, self.t0_wall + (end - self.t0)
        return LoadRun([s for s in self.shots if start <= s.due < end_wall], start, end_wall,
                       {"generator": f"{name} ({LOOP_NAME})", "connections_opened": self.opened,
                        "connections_reused": self.reused})


def poisson_offsets(rate_rps: float, total_s: float, seed: int) -> list[float]:
    """Return the send times (seconds from the start) of Poisson arrivals at rate_rps within total_s."""
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(rate_rps)
    while t < total_s:
        offsets.append(t)
        t += rng.expovariate(rate_rps)
    return offsets


async def open_loop(url: str, rate_rps: float, duration_s: float, warmup_s: float, templates: list[str],
                    timeout_s: float = CLIENT_TIMEOUT_S, seed: int = 0) -> LoadRun:
    """Send Poisson arrivals at rate_rps for warmup_s + duration_s, each timed from when it was due; the window's
    shots, with the rate it put on the wire in the window (`sent_rps`)."""
    gen = Generator(Target.from_url(url), templates, timeout_s)
    offsets = poisson_offsets(rate_rps, warmup_s + duration_s, seed)

    async def schedule() -> float:
        i = 0
        while i < len(offsets):
            now = time.monotonic()
            while i < len(offsets) and gen.t0 + offsets[i] <= now:  # everything due by now, late ones included
                gen.send(gen.t0 + offsets[i], i)
                i += 1
            if i < len(offsets):
                await asyncio.sleep(max(MIN_SLEEP_S, gen.t0 + offsets[i] - time.monotonic()))
        return gen.t0 + warmup_s + duration_s

    run = await gen.run(schedule(), warmup_s, "testing.load open loop")
    sent = sum(1 for s in gen.shots if run.start <= s.due + s.lag_s < run.end)
    run.generator["sent_rps"] = round(sent / duration_s, 2)
    return run


async def closed_loop(url: str, clients: int, duration_s: float, warmup_s: float, templates: list[str],
                      timeout_s: float = CLIENT_TIMEOUT_S, until: threading.Event | None = None,
                      answers: bool = False) -> LoadRun:
    """Keep `clients` requests in flight (each sent when one ends, the templates in turn) for warmup_s + duration_s,
    or until `until` is set; `answers`: keep each valid answer's text."""
    gen = Generator(Target.from_url(url), templates, timeout_s, answers)
    stop_at, sent = gen.t0 + warmup_s + duration_s, itertools.count()

    def sending(now: float) -> bool:
        return now < stop_at and not (until is not None and until.is_set())

    def next_request() -> None:
        if sending(now := time.monotonic()):
            gen.send(now, next(sent))

    async def schedule() -> float:
        for _ in range(clients):
            next_request()
        while sending(time.monotonic()):
            await asyncio.sleep(min(WATCHDOG_S, max(0.0, stop_at - time.monotonic())))
        return min(time.monotonic(), stop_at)

    gen.after_shot = next_request
    return await gen.run(schedule(), warmup_s, "testing.load closed loop")


def run(driver: Coroutine[Any, Any, LoadRun]) -> LoadRun:
    """Run a driver (`open_loop`, `closed_loop`) on an event loop of its own (uvloop where installed); add the
    generator's own CPU over it, as a share of one core (it shares the machine with the server)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        done = runner.run(driver)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    done.generator |= {"generator_cpu_pct": round(100 * cpu_s / wall_s, 1) if wall_s > 0 else 0.0,
                       "generator_cpu_s": round(cpu_s, 3), "generator_wall_s": round(wall_s, 2)}
    return done


def main(argv: list[str] | None = None) -> int:
    """Say what this module is and which tools run it: it is a library, driven by the tools' own flags."""
    parser = argparse.ArgumentParser(
        prog="python -m testing.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A library, not a tool: load runs start from testing.bench (closed and open loops, gates, factors), "
               "testing.ab (two commits compared), testing.soak (hours), testing.swap_load (a model swap under load) "
               "and testing.device; each takes --help.")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
