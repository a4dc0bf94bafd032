"""The fakes the tests and the load tools share: fake correctors and the gunicorn app factories around them.

Here, with the tests, because fakes belong to them; the benchmark's smoke mode (`python -m testing.bench --fake`)
serves them too, run from the repository root like every tool, where `tests` imports as a
namespace package. tests/conftest.py keeps only fixtures, built from these.

Test-only stand-ins: the served path (`api:create_app()`, `make run`) always runs the real corrector.

- `FakeCorrector`: answers MARK + TOP1's Han characters; slow, gated, failing or with another answer on demand.
- `FaultCorrector` with `Raise`, `Hang`, `KillWorker`: fails chosen batches on purpose (tests/faults).
- `FakeRedis` (the two calls the Redis cache makes, failing on demand) and `FakeCacheObserver` (tests/cache).
- App factories for gunicorn (`gunicorn -c server/gunicorn_conf.py "tests.fakes:create_fake_app()"`), each the
  real app with settings from the environment (`Config.from_env()`) around a fake:
  `create_fake_app` (FAKE_DELAY_S per batch, default 0.005: client tests, `python -m testing.bench --fake`),
  `create_replica_app` (FAKE_DELAY_S default 0.02, answers tagged with an `X-Replica: $REPLICA_NAME` header:
  the load-balancer test), `create_slow_app` (a FaultCorrector taking FAULT_DELAY_S per batch, default 0.05:
  shutdown and log tests), `create_slow_loading_app` (the same, loading for LOAD_DELAY_S,
  default 3, on a thread as the real corrector does: the worker-boot tests).

The process engine's picklable fakes stay in tests/deploy/fake_models.py: spawned workers import them by name
and only that engine's tests use them.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask, Response

from api import create_app
from config import Config
from hosting.loading import LoadingCorrector
from preprocess.text import NBest, han_chars


class FakeCorrector:
    """Answer with MARK + TOP1's Han characters, so a model answer is told apart from a TOP1 answer.

    `delay_s` sleeps in each batch, `gate` (a threading.Event) holds each batch until set, `error` is
    raised from each batch, `answer` replaces the answer function. Every batch is recorded in `batches`.
    """

    MARK = "改"

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None,
                 error: Exception | None = None, answer: Callable[[NBest], Any] | None = None) -> None:
        self.delay_s = delay_s
        self.gate = gate
        self.error = error
        self.answer = answer or self.expected
        self.ready = True
        self.batches: list[list[NBest]] = []
        self.started = threading.Event()
        self._lock = threading.Lock()

    @classmethod
    def expected(cls, item: NBest) -> str:
        """Return the answer this fake gives to an n-best list."""
        return cls.MARK + han_chars(item.top1)

    def predict_batch(self, items: list[NBest]) -> list[Any]:
        with self._lock:
            self.batches.append(list(items))
        self.started.set()
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return [self.answer(item) for item in items]

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.batches)

    @property
    def info(self) -> dict[str, Any]:
        return {"name": "fake-corrector", "version": "test", "parameters": 0, "weights": Path("/nowhere")}


class FakeClock:
    """time.monotonic() under the test's control."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class WorkerKilled(BaseException):  # noqa: N818 - named for what it does to the thread, like SystemExit
    """Raised from the batch function to end the worker thread: not an Exception, so nothing catches it early."""


@dataclass(frozen=True)
class Raise:
    """Make one batch raise `error`."""

    error: Exception


@dataclass(frozen=True)
class Hang:
    """Make one batch block for `seconds` (or until released) before it answers."""

    seconds: float


@dataclass(frozen=True)
class KillWorker:
    """Make one batch raise `exc_type`, a BaseException that ends the worker thread."""

    exc_type: type[BaseException] = WorkerKilled


Fault = Raise | Hang | KillWorker


class FaultCorrector:
    """Answer MARK + TOP1's Han characters after `delay_s`, failing the batches that armed faults name.

    Answers like `FakeCorrector` (so a model answer is told apart from a TOP1 answer), except on the batches
    for which faults were armed with `arm()`: each armed fault is used up by one batch, in order.

    - `Raise(error)`: the batch function raises `error` (an ordinary exception: the batch fails, the worker lives).
    - `Hang(seconds)`: the batch function blocks for `seconds` (or until `release()`), then answers, late.
    - `KillWorker(exc_type)`: the batch function raises a BaseException that is not an Exception (SystemExit,
      KeyboardInterrupt, `WorkerKilled`): service-streamer's worker thread ends and the batcher must replace it.
    """

    MARK = "改"

    def __init__(self, delay_s: float = 0.0, record: bool = True) -> None:
        self.delay_s = delay_s
        self.ready = True
        # Every batch is kept for the tests to read; a long-running server (create_slow_app) must not keep them.
        self.record = record
        self.batches: list[list[NBest]] = []
        self._calls = 0
        self.faulted: list[tuple[Fault, list[NBest]]] = []
        self.hanging = threading.Event()
        self._armed: deque[Fault] = deque()
        self._release = threading.Event()
        self._lock = threading.Lock()

    @classmethod
    def expected(cls, item: NBest) -> str:
        """Return the answer this corrector gives when no fault is armed."""
        return cls.MARK + han_chars(item.top1)

    def arm(self, *faults: Fault) -> None:
        """Make the next batches fail, one fault per batch, in this order."""
        with self._lock:
            self._armed.extend(faults)

    def release(self) -> None:
        """End every hang now and from now on (tests call it on teardown so no thread is left blocked)."""
        self._release.set()

    @property
    def armed(self) -> int:
        """Count the faults not used up yet."""
        with self._lock:
            return len(self._armed)

    @property
    def faulted_items(self) -> list[NBest]:
        """Return the questions of every batch a fault hit."""
        with self._lock:
            return [item for _, items in self.faulted for item in items]

    @property
    def calls(self) -> int:
        """Count the batches run so far, faulty or not."""
        with self._lock:
            return self._calls

    def predict_batch(self, items: list[NBest]) -> list[str]:
        """Answer a batch, unless the next armed fault says otherwise."""
        with self._lock:
            self._calls += 1
            if self.record:
                self.batches.append(list(items))
            fault = self._armed.popleft() if self._armed else None
            if fault is not None:
                self.faulted.append((fault, list(items)))
        if self.delay_s:
            time.sleep(self.delay_s)
        match fault:
            case Raise(error):
                raise error
            case KillWorker(exc_type):
                raise exc_type("fault injected: end the batch worker thread")
            case Hang(seconds):
                self.hanging.set()
                try:
                    self._release.wait(seconds)
                finally:
                    self.hanging.clear()
        return [self.expected(item) for item in items]

    @property
    def info(self) -> dict[str, Any]:
        return {"name": "fault-corrector", "version": "test", "parameters": 0, "weights": Path("/nowhere")}


class FakeRedis:
    """The calls RedisResultCache makes (get, set, and sets through a pipeline); `error` is raised by each while set."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.ttl_ms: dict[str, int] = {}
        self.error: Exception | None = None
        self.calls = 0

    def get(self, key: str) -> bytes | None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.data.get(key)

    def set(self, key: str, value: str, px: int) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        self.data[key] = value.encode()
        self.ttl_ms[key] = px

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self)


class FakePipeline:
    """redis-py's pipeline as RedisResultCache.put_many uses it: SETs queued, then run through the fake's own `set`
    (so a subclass's delay, gate or error applies to each) when executed."""

    def __init__(self, client: FakeRedis) -> None:
        self._client = client
        self._sets: list[tuple[str, str, int]] = []

    def set(self, key: str, value: str, px: int) -> None:
        self._sets.append((key, value, px))

    def execute(self) -> list[bool]:
        for key, value, px in self._sets:
            self._client.set(key, value, px)
        return [True] * len(self._sets)


class FakeCacheObserver:
    """Record what the cache reports to metrics (cache.CacheObserver): lookups by level and result, the circuit."""

    def __init__(self) -> None:
        self.lookups: list[tuple[str, str]] = []
        self.circuit: list[bool] = []

    def cache_lookup(self, level: str, result: str) -> None:
        self.lookups.append((level, result))

    def redis_circuit(self, is_open: bool) -> None:
        self.circuit.append(is_open)


# ---------------------------------------------------------------------------------------------------------------
# App factories for gunicorn: the real app, settings from the environment, a fake in place of the model.


def create_fake_app() -> Flask:
    """Build the app from the environment's settings around a FakeCorrector (FAKE_DELAY_S per batch)."""
    delay_s = float(os.environ.get("FAKE_DELAY_S", "0.005"))
    return create_app(Config.from_env(), corrector=FakeCorrector(delay_s=delay_s))


def create_replica_app() -> Flask:
    """Build the service around a FakeCorrector that takes FAKE_DELAY_S per batch, tagged with REPLICA_NAME.

    Each answer carries an `X-Replica` header naming the replica (a header, so the judge's four-key body is
    untouched), so the load-balancer test can tell which replica answered.
    """
    app = create_app(Config.from_env(), corrector=FakeCorrector(delay_s=float(os.environ.get("FAKE_DELAY_S", "0.02"))))
    replica = os.environ.get("REPLICA_NAME", "")

    @app.after_request
    def tag(response: Response) -> Response:
        response.headers["X-Replica"] = replica
        return response

    return app


def create_failing_app() -> Flask:
    """Build the service around a FakeCorrector whose every batch raises (each question answered TOP1)."""
    return create_app(Config.from_env(), corrector=FakeCorrector(error=RuntimeError("the model failed")))


def create_slow_app() -> Flask:
    """Build the service around a FaultCorrector that sleeps FAULT_DELAY_S per batch and never faults."""
    delay_s = float(os.environ.get("FAULT_DELAY_S", "0.05"))
    # record=False: a long benchmark run sends this server hundreds of thousands of questions.
    return create_app(Config.from_env(), corrector=FaultCorrector(delay_s=delay_s, record=False))


def create_slow_loading_app() -> Flask:
    """Build the service around a FaultCorrector that takes LOAD_DELAY_S to load, on a thread."""
    delay_s = float(os.environ.get("FAULT_DELAY_S", "0.05"))
    load_delay_s = float(os.environ.get("LOAD_DELAY_S", "3"))

    def load() -> FaultCorrector:
        time.sleep(load_delay_s)
        return FaultCorrector(delay_s=delay_s, record=False)

    return create_app(Config.from_env(), corrector=LoadingCorrector(load).start())
