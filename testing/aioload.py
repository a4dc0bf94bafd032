"""The benchmark's open-loop generator: Poisson arrivals on one asyncio (uvloop) event loop, keep-alive HTTP/1.1; and
a closed loop on the same machinery, for machines without wrk (a lent GPU machine)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from testing.loadgen import CLIENT_TIMEOUT_S, CONNECTION_PROBLEM, TIMEOUT_PROBLEM, Shot, cpu_figures, fresh_payload
from testing.samples import check_answer

# Well below gunicorn's keepalive (server/gunicorn_conf.py: 75 s), as nginx's upstream keepalive_timeout (4 s) is.
IDLE_CLOSE_S = 4.0
# How often the watchdog looks for requests past their timeout.
WATCHDOG_S = 0.05
# The schedule sleeps at least this long between sends (what is due meanwhile leaves together, its lag recorded):
# a shorter sleep is a spin on uvloop, whose timers count whole milliseconds.
MIN_SLEEP_S = 0.001
# An answer to /inference is a few hundred bytes; a header block over this is not one.
MAX_HEADER_BYTES = 64 * 1024

try:
    import uvloop

    _loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:
    _loop_factory = None
LOOP_NAME = "asyncio" if _loop_factory is None else "uvloop"


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


@dataclass(slots=True)
class Request:
    """One request in flight: when it was due (wall clock, and the loop's clock), when it left, its esun_uuid."""

    due_wall: float
    due: float
    sent: float
    esun_uuid: str
    deadline: float


@dataclass(frozen=True)
class Answer:
    """One parsed HTTP answer: status, body, and whether the server keeps the connection open."""

    status: int
    body: bytes
    keep_alive: bool


def parse_answer(buffer: bytearray, closed: bool = False) -> tuple[Answer, int] | None:
    """Parse one HTTP/1.1 answer at the start of buffer; return it and its length, None while incomplete (`closed`:
    a body without a length ends here). ValueError if it is not HTTP, or chunked (the service sends a length)."""
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
        self.request = request
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.request is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.close()
            return
        try:
            parsed = parse_answer(self.buffer)
        except ValueError as exc:
            self._fail(f"{CONNECTION_PROBLEM}{exc}")
            return
        if parsed is not None:
            answer, used = parsed
            del self.buffer[:used]
            request, self.request = self.request, None
            if not answer.keep_alive:
                self.close()
            self.generator.answered(self, request, answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.request is not None:
            try:
                parsed = parse_answer(self.buffer, closed=True)
            except ValueError:
                parsed = None
            if parsed is not None:
                request, self.request = self.request, None
                self.generator.answered(self, request, parsed[0])
                return
            why = type(exc).__name__ if exc is not None else (
                "cut mid-answer" if self.buffer else "closed before answering")
            self._fail(f"{CONNECTION_PROBLEM}{why}")

    def timed_out(self) -> None:
        """The request in flight is past its timeout: record it and drop the connection (its answer is pending)."""
        self._fail(f"{TIMEOUT_PROBLEM}no answer in time")

    def usable(self, now: float) -> bool:
        return not self.closed and now - self.idle_since < IDLE_CLOSE_S

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, problem: str) -> None:
        request, self.request = self.request, None
        self.close()
        if request is not None:
            self.generator.failed(self, request, problem)


class Generator:
    """The shots, the idle connections, the requests in flight, and the target's bytes."""

    def __init__(self, target: Target, templates: list[str], timeout_s: float) -> None:
        self.target = target
        self.templates = templates
        self.timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.t0_wall = time.time()
        self.shots: list[Shot] = []
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self.opening = 0
        self.opened = 0
        self.reused = 0
        self.after_shot: Callable[[], None] | None = None  # a closed loop's next request, once one has ended

    def send(self, due: float, index: int) -> None:
        """Send the request due at `due` (loop clock) on an idle connection, or a new one."""
        esun_uuid, payload = fresh_payload(self.templates[index % len(self.templates)])
        now = self.loop.time()
        request = Request(self.t0_wall + (due - self.t0), due, now, esun_uuid, due + self.timeout_s)
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to be closing
            if conn.usable(now):
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
            async with asyncio.timeout_at(request.deadline):
                _, conn = await self.loop.create_connection(lambda: Connection(self), self.target.host,
                                                            self.target.port)
        except (OSError, TimeoutError) as exc:
            self.opening -= 1
            self._record(request, 0, f"{TIMEOUT_PROBLEM}no connection in time" if isinstance(exc, TimeoutError)
                         else f"{CONNECTION_PROBLEM}{type(exc).__name__}")
            return
        self.opening -= 1
        self.opened += 1
        self.busy.add(conn)
        request.sent = self.loop.time()
        conn.send(request, data)

    def answered(self, conn: Connection, request: Request, answer: Answer) -> None:
        self._record(request, answer.status, check_answer(answer.status, answer.body, request.esun_uuid))
        self.busy.discard(conn)
        if not conn.closed:
            conn.idle_since = self.loop.time()
            self.idle.append(conn)

    def failed(self, conn: Connection, request: Request, problem: str) -> None:
        self._record(request, 0, problem)
        self.busy.discard(conn)

    def _record(self, request: Request, status: int, problem: str | None) -> None:
        now = self.loop.time()
        self.shots.append(Shot(request.due_wall, now - request.due, status, problem,
                               lag_s=max(0.0, request.sent - request.due), esun_uuid=request.esun_uuid))
        if self.after_shot is not None:  # soon, not now: an answered connection goes back to the idle ones first
            self.loop.call_soon(self.after_shot)

    async def watchdog(self) -> None:
        """End the requests past their timeout, every WATCHDOG_S."""
        while True:
            await asyncio.sleep(WATCHDOG_S)
            now = self.loop.time()
            for conn in [c for c in self.busy if c.request is not None and c.request.deadline <= now]:
                conn.timed_out()

    async def drain(self) -> None:
        """Wait until no request is in flight or being opened (each ends by its answer or its timeout)."""
        while self.busy or self.opening:
            await asyncio.sleep(WATCHDOG_S)

    def close(self) -> None:
        for conn in [*self.idle, *self.busy]:
            conn.close()


def poisson_offsets(rate_rps: float, total_s: float, seed: int) -> list[float]:
    """Return the send times (seconds from the start) of Poisson arrivals at rate_rps within total_s."""
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(rate_rps)
    while t < total_s:
        offsets.append(t)
        t += rng.expovariate(rate_rps)
    return offsets


async def _open_loop(target: Target, rate_rps: float, duration_s: float, warmup_s: float, templates: list[str],
                     timeout_s: float, seed: int) -> tuple[list[Shot], float, float, dict[str, Any]]:
    gen = Generator(target, templates, timeout_s)
    watchdog = asyncio.create_task(gen.watchdog())
    offsets = poisson_offsets(rate_rps, warmup_s + duration_s, seed)
    i = 0
    while i < len(offsets):
        now = gen.loop.time()
        while i < len(offsets) and gen.t0 + offsets[i] <= now:  # everything due by now, late ones included
            gen.send(gen.t0 + offsets[i], i)
            i += 1
        if i < len(offsets):
            await asyncio.sleep(max(MIN_SLEEP_S, gen.t0 + offsets[i] - gen.loop.time()))
    dispatch_s = gen.loop.time() - gen.t0
    await gen.drain()
    watchdog.cancel()
    gen.close()
    start, end = gen.t0_wall + warmup_s, gen.t0_wall + warmup_s + duration_s
    measured = [s for s in gen.shots if start <= s.due < end]
    generator = {"generator": f"aioload ({LOOP_NAME})", "scheduled_rps": round(len(offsets) / max(dispatch_s, 1e-9), 2),
                 "sent_rps": round(sum(1 for s in gen.shots if start <= s.due + s.lag_s < end) / duration_s, 2),
                 "connections_opened": gen.opened, "connections_reused": gen.reused}
    return measured, start, end, generator


async def _closed_loop(target: Target, clients: int, duration_s: float, warmup_s: float, templates: list[str],
                       timeout_s: float) -> tuple[list[Shot], float, float, dict[str, Any]]:
    gen = Generator(target, templates, timeout_s)
    watchdog = asyncio.create_task(gen.watchdog())
    stop_at = gen.t0 + warmup_s + duration_s
    sent = 0

    def next_request() -> None:
        nonlocal sent
        now = gen.loop.time()
        if now < stop_at:
            gen.send(now, sent)
            sent += 1

    gen.after_shot = next_request
    for _ in range(clients):
        next_request()
    await asyncio.sleep(max(0.0, stop_at - gen.loop.time()))
    await gen.drain()
    watchdog.cancel()
    gen.close()
    start, end = gen.t0_wall + warmup_s, gen.t0_wall + warmup_s + duration_s
    return ([s for s in gen.shots if start <= s.due < end], start, end,
            {"generator": f"aioload closed loop ({LOOP_NAME})", "connections_opened": gen.opened,
             "connections_reused": gen.reused})


def closed_loop(url: str, clients: int, duration_s: float, warmup_s: float, templates: list[str],
                timeout_s: float = CLIENT_TIMEOUT_S) -> tuple[list[Shot], float, float, dict[str, Any]]:
    """Keep `clients` requests in flight (each sent when one ends) for warmup_s + duration_s, as wrkload's does."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        shots, start, end, generator = runner.run(
            _closed_loop(Target.from_url(url), clients, duration_s, warmup_s, templates, timeout_s))
    return shots, start, end, generator | cpu_figures(time.process_time() - cpu0, time.perf_counter() - wall0)


def open_loop(url: str, rate_rps: float, duration_s: float, warmup_s: float, templates: list[str],
              timeout_s: float = CLIENT_TIMEOUT_S, seed: int = 0) -> tuple[list[Shot], float, float, dict[str, Any]]:
    """Send Poisson arrivals at rate_rps for warmup_s + duration_s; return the window's shots, start, end, figures."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        shots, start, end, generator = runner.run(
            _open_loop(Target.from_url(url), rate_rps, duration_s, warmup_s, templates, timeout_s, seed))
    return shots, start, end, generator | cpu_figures(time.process_time() - cpu0, time.perf_counter() - wall0)
