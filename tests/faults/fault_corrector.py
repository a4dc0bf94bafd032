"""A corrector for tests that fails on purpose: raises, hangs or kills the batcher's worker thread.

`FaultCorrector` answers like tests/conftest.py's FakeCorrector (MARK + TOP1's Han characters, so a model
answer is told apart from a TOP1 answer) and takes `delay_s` per batch, except on the batches for which
faults were armed with `arm()`: each armed fault is used up by one batch, in order.

- `Raise(error)`: the batch function raises `error` (an ordinary exception: the batch fails, the worker lives).
- `Hang(seconds)`: the batch function blocks for `seconds` (or until `release()`), then answers, late.
- `KillWorker(exc_type)`: the batch function raises a BaseException that is not an Exception (SystemExit,
  KeyboardInterrupt, `WorkerKilled`): service-streamer's worker thread ends and the batcher must replace it.

Fakes live in tests only: the served path always runs the real corrector.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preprocess.text import NBest, han_only


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
    """Answer MARK + TOP1's Han characters after `delay_s`, failing the batches that armed faults name."""

    MARK = "改"

    def __init__(self, delay_s: float = 0.0, record: bool = True) -> None:
        self.delay_s = delay_s
        self.ready = True
        # Every batch is kept for the tests to read; a long-running server (slow_app) must not keep them.
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
        return cls.MARK + han_only(item.top1)

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
