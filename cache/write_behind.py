"""Writes on one daemon thread, so that a slow store never holds up the thread that stores an answer."""

from __future__ import annotations

import atexit
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger("api.cache")

# Writes waiting for Redis: at 30 ms a SET, a full queue is half a minute behind; later ones are dropped.
WRITE_QUEUE_SIZE = 1024
# How long a closing writer (or the process's exit) waits for the queued writes to land.
WRITE_DRAIN_S = 1.0
# The most writes handed to the store at once: one SQLite transaction or one Redis round trip. A batch of the model's
# answers lands together, and one commit for all of them costs what one did for each (docs/benchmarks.md, issue 46).
WRITE_BATCH_SIZE = 256


class WriteBehind:
    """Run `write_many(items)` on one daemon thread, so that a slow store never holds up the thread that asks.

    `submit` only queues and returns: the caller may be the batcher's single worker thread, settling a batch
    of futures whose callbacks store answers, and 64 synchronous 30 ms writes there would make the rest of
    the batch and the next one miss the judge's deadline. The queue is bounded (`max_pending`); a write for a
    key already queued replaces it (the latest answer wins, and the queue does not grow); a write that finds
    the queue full or the writer closed is dropped and counted in `dropped`, with one warning per burst.
    The thread takes everything queued at once (up to `max_batch` writes) and hands it to `write_many` in one call, so
    that the answers of one batch reach the store in one transaction or round trip rather than one each. A
    `write_many` that raises is logged (its writes are lost) and the thread goes on with the next. The thread starts
    with the first
    write (so an app built before a fork starts it in the process that serves), and `close` stops it once the
    queue is drained; it is also called at exit, since a daemon thread would die with its queue unwritten.
    """

    def __init__(self, write_many: Callable[[list[tuple[str, str]]], None], max_pending: int = WRITE_QUEUE_SIZE,
                 name: str = "cache-writer", max_batch: int = WRITE_BATCH_SIZE) -> None:
        if max_pending < 1 or max_batch < 1:
            raise ValueError(f"max_pending and max_batch must be >= 1, got {max_pending} and {max_batch}")
        self._write_many = write_many
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._name = name
        self._pending: OrderedDict[str, str] = OrderedDict()
        self._cond = threading.Condition()
        self._writing: set[str] = set()  # the keys of the writes taken off the queue that have not returned yet
        self._settled: dict[str, threading.Event] = {}  # keys a caller waits on (`settled`), set once written
        self._closed = False
        self._dropping = False  # writes were dropped since the queue was last empty: warned already
        self._dropped = 0
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """How many writes were dropped (queue full, or submitted after `close`)."""
        with self._cond:
            return self._dropped

    @property
    def pending(self) -> int:
        """How many writes wait in the queue (the one being written not included)."""
        with self._cond:
            return len(self._pending)

    def submit(self, key: str, value: str) -> bool:
        """Queue a write and return at once: True when queued, False when dropped."""
        with self._cond:
            full = key not in self._pending and len(self._pending) >= self._max_pending
            if not (self._closed or full):
                self._pending[key] = value
                self._start()
                self._cond.notify_all()
                return True
            self._dropped += 1
            warn, self._dropping = not self._dropping, True
            dropped, closed = self._dropped, self._closed
        if warn:
            log.warning("cache write dropped: the writer is %s", "closed" if closed else "behind",
                        extra={"fields": {"writer": self._name, "max_pending": self._max_pending,
                                          "dropped_total": dropped}})
        return False

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write has returned; False when `timeout` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._writing, timeout)

    def settled(self, key: str, timeout: float) -> bool:
        """Wait until the write queued for `key` has returned (written, or failed and logged); True at once when none
        is queued or being written, False when `timeout` seconds passed first. Only the caller waiting on `key` is
        woken when it lands, not every waiter on every write."""
        with self._cond:
            if key not in self._pending and key not in self._writing:
                return True
            landed = self._settled.setdefault(key, threading.Event())
        return landed.wait(timeout)

    def close(self, timeout: float = WRITE_DRAIN_S) -> None:
        """Refuse new writes, let the thread write what is queued, and wait up to `timeout` for it to stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("cache writer still busy after close", extra={"fields": {
                    "writer": self._name, "timeout_s": timeout, "pending": self.pending}})

    def _start(self) -> None:
        # Called with the lock held. is_alive(): a thread does not survive a fork of its process.
        if self._thread is not None and self._thread.is_alive():
            return
        first = self._thread is None
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if first:
            # Drain the queue before exit, so that a stopping replica's last answers land.
            atexit.register(self.close, WRITE_DRAIN_S)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return  # closed, and nothing left to write
                items = [self._pending.popitem(last=False) for _ in range(min(len(self._pending), self._max_batch))]
                self._writing = {key for key, _ in items}
            try:
                self._write_many(items)
            except Exception:
                log.exception("cache write failed", extra={"fields": {"writer": self._name, "writes": len(items)}})
            finally:
                with self._cond:
                    for key in self._writing:
                        landed = self._settled.pop(key, None) if key not in self._pending else None
                        if landed is not None:
                            landed.set()
                    self._writing = set()
                    if not self._pending:
                        self._dropping = False  # caught up: the next drop starts a new burst, worth a warning
                    self._cond.notify_all()
