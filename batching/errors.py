"""What the batching engines report: their errors, the per-batch report their hook receives, and their counters."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = [
    "BatchFailed",
    "BatchReport",
    "BatcherClosed",
    "BatcherError",
    "BatcherStats",
    "DeadlineExceeded",
    "Overloaded",
    "Tally",
]


class BatcherError(Exception):
    """Base of every error the batcher reports."""


class Overloaded(BatcherError):
    """max_in_flight items are already admitted; raised by submit at once."""


class DeadlineExceeded(BatcherError):
    """The item's deadline passed before its batch started."""


class BatchFailed(BatcherError):
    """The batch function raised, returned the wrong number of results, or its worker died."""


class BatcherClosed(BatcherError):
    """The batcher is closed, or closed before the item ran."""


@dataclass(frozen=True)
class BatchReport:
    """One run of the batch function, as the engine's ``on_batch`` hook receives it (before any waiter wakes).

    size: items run. run_s: seconds the batch function took. queue_wait_s: for each item run, seconds from its
    submit to the start of the batch. failed: the batch function raised or miscounted. padded_waste: max_len * n -
    sum(len) by the engine's size_of (0 without one).
    """

    size: int
    run_s: float
    queue_wait_s: tuple[float, ...] = ()
    failed: bool = False
    padded_waste: int = 0


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot of the batcher's state; counters run since it started.

    in_flight: admitted and not yet answered. batches / items: calls of the batch function and the items they
    carried. failures: batches that raised or answered the wrong count. dropped_expired: items failed with
    DeadlineExceeded (or, across processes, never answered). overloaded: submits refused. padded_waste: sum over
    batches of max_len * n - sum(len), by size_of. restarts: dead workers replaced. running_for_s: age of the
    running batch, 0.0 if none (or not known, across processes).
    """

    in_flight: int
    batches: int
    items: int
    failures: int
    dropped_expired: int
    overloaded: int
    padded_waste: int
    last_batch_size: int
    worker_alive: bool
    restarts: int
    running_for_s: float


@dataclass
class Tally:
    """Counters written by workers, collectors, monitors and submitters, under one lock."""

    batches: int = 0
    items: int = 0
    failures: int = 0
    dropped_expired: int = 0
    overloaded: int = 0
    padded_waste: int = 0
    last_batch_size: int = 0
    restarts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def expired(self) -> None:
        """Count one item failed for its deadline (or never answered)."""
        with self.lock:
            self.dropped_expired += 1

    def refused(self) -> None:
        """Count one submit refused for max_in_flight."""
        with self.lock:
            self.overloaded += 1

    def restarted(self) -> None:
        """Count one dead worker replaced."""
        with self.lock:
            self.restarts += 1

    def batch_ran(self, report: BatchReport) -> None:
        """Count one call of the batch function."""
        with self.lock:
            self.batches += 1
            self.items += report.size
            self.failures += int(report.failed)
            self.padded_waste += report.padded_waste
            self.last_batch_size = report.size

    def snapshot(self, in_flight: int, worker_alive: bool, running_for_s: float) -> BatcherStats:
        """Return the counters with the engine's live figures."""
        with self.lock:
            return BatcherStats(
                in_flight=in_flight, batches=self.batches, items=self.items, failures=self.failures,
                dropped_expired=self.dropped_expired, overloaded=self.overloaded, padded_waste=self.padded_waste,
                last_batch_size=self.last_batch_size, worker_alive=worker_alive, restarts=self.restarts,
                running_for_s=running_for_s,
            )
