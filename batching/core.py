"""The lifecycle both engines share: admission, the registry of jobs in flight, deadlines, close, watch and stats.

An engine (``batching.threaded``, ``batching.process``) owns a ``Core`` and supplies only what differs: how a job
is queued (``enqueue``, which returns the streamer's task id), what a monitor round checks, and how its workers
stop. The core keeps the promise both engines make: every admitted job's future is resolved exactly once, by
whoever gets there first (the threaded worker or the process engine's collector, the monitor, close, a submit that
finds a dead worker), and its slot is released when it is.

Thread safety: every method may be called from any thread. ``lock`` serialises admission, registration and
release; an engine holds it to swap a worker so that no submit slips between the check and the swap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from batching.errors import (
    BatcherClosed,
    BatcherStats,
    BatchFailed,
    BatchReport,
    DeadlineExceeded,
    Overloaded,
    Tally,
)

__all__ = ["POLL_S", "Core", "Job", "failure", "settle", "validate_limits"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)

# How often idle threads wake to notice deadlines, a dead worker or close(); also the worst added expiry delay.
# Read at each use (batching.core.POLL_S), so a test can slow every engine's polling down.
POLL_S = 0.05


@dataclass(eq=False)
class Job(Generic[T, R]):
    """One submitted item with its deadline, the future its waiter holds, and when it was submitted."""

    item: T
    deadline: float
    future: Future[R]
    enqueued_at: float
    size: int = 0
    task_id: int = -1
    given_up: bool = False  # expired by the monitor before it started; set and read under Core's start lock


def settle(future: Future[Any], *, result: Any = None, error: BaseException | None = None) -> bool:
    """Resolve a future unless someone else already did; say whether this call resolved it."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        # The monitor, close() and the worker may race to resolve one item; the first answer stands.
        return False
    return True


def failure(message: str, cause: BaseException | None = None) -> BatchFailed:
    """Build the error one waiter of a failed batch receives (one instance per waiter: tracebacks differ)."""
    error = BatchFailed(message)
    error.__cause__ = cause
    return error


def validate_limits(max_batch_size: int, max_wait_s: float, max_in_flight: int) -> None:
    """Reject batch limits no engine can honour."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_wait_s < 0:
        raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")


class Core(Generic[T, R]):
    """Admit jobs up to max_in_flight, track them until resolved, expire, report, watch and close.

    ``on_batch(report)`` is the engine's one per-batch hook (metrics); ``on_count(now, count)`` hears every change
    of the number in flight (under ``lock``); ``on_release(job)`` runs after a resolved job left the registry.
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        name: str,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_count: Callable[[float, int], None] | None = None,
        on_release: Callable[[Job[T, R]], None] | None = None,
    ) -> None:
        self.tally = Tally()
        self.lock = threading.Lock()
        self._starting = threading.Lock()  # makes start's check-and-mark atomic against expire_unstarted
        self._drained = threading.Condition(self.lock)
        self._jobs: dict[int, Job[T, R]] = {}
        self._max_in_flight = max_in_flight
        self._name = name
        self._on_batch = on_batch
        self._on_count = on_count
        self._on_release = on_release
        self._closed = False
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, item: T, deadline: float, enqueue: Callable[[Job[T, R]], int], size: int = 0) -> Future[R]:
        """Admit one item and queue it with enqueue (under the lock); return its future."""
        now = time.monotonic()
        job: Job[T, R] = Job(item, deadline, Future(), enqueued_at=now, size=size)
        with self.lock:
            if self._closed:
                raise BatcherClosed("batcher is closed")
            if now >= deadline:
                self.expire(job)  # no callbacks yet, so resolving under the lock is safe
                return job.future
            if len(self._jobs) >= self._max_in_flight:
                self.tally.refused()
                raise Overloaded(f"{len(self._jobs)} items in flight, max_in_flight is {self._max_in_flight}")
            # Registered before queueing: a resolver's callback waits for this lock, so the entry is there.
            job.future.add_done_callback(partial(self._release, job))
            job.task_id = enqueue(job)
            self._jobs[job.task_id] = job
            self._counted(now)
        return job.future

    def in_flight(self) -> int:
        """Jobs admitted and not yet resolved (read without the lock: a dict's length is read whole)."""
        return len(self._jobs)

    def job(self, task_id: int) -> Job[T, R] | None:
        """Return the job in flight under this task id, if any."""
        with self.lock:
            return self._jobs.get(task_id)

    def jobs(self) -> list[Job[T, R]]:
        """Return the jobs in flight (admitted, not yet resolved)."""
        with self.lock:
            return list(self._jobs.values())

    def jobs_held(self) -> list[Job[T, R]]:
        """Return the jobs in flight; the caller holds ``lock`` (to act on them before anyone else can)."""
        return list(self._jobs.values())

    def overdue(self, grace_s: float = 0.0) -> list[Job[T, R]]:
        """Return the jobs in flight whose deadline passed more than grace_s ago."""
        now = time.monotonic()
        with self.lock:
            return [job for job in self._jobs.values() if job.deadline + grace_s <= now]

    def expire(self, job: Job[T, R]) -> None:
        """Fail a job whose deadline passed before it ran."""
        if settle(job.future, error=DeadlineExceeded("deadline passed before the item's batch started")):
            self.tally.expired()

    def start(self, job: Job[T, R], now: float) -> bool:
        """Mark a job running if it is still wanted and in time; expire it if late."""
        with self._starting:
            if job.future.done() or job.given_up:
                return False
            if now < job.deadline:
                try:
                    return job.future.set_running_or_notify_cancel()
                except RuntimeError:
                    # Resolved by close() between the done() check and here.
                    return False
        self.expire(job)
        return False

    def expire_unstarted(self, job: Job[T, R]) -> None:
        """Expire a job no worker has started; once this returns none will (atomic against `start`, so a job that
        did start keeps its answer instead of having it replaced by DeadlineExceeded)."""
        with self._starting:
            if job.future.running():
                return
            job.given_up = True
        self.expire(job)

    def report(self, report: BatchReport) -> None:
        """Count one run of the batch function and tell the on_batch hook; a failing hook is only logged."""
        self.tally.batch_ran(report)
        if self._on_batch is None:
            return
        try:
            self._on_batch(report)
        except Exception:
            logger.exception("on_batch hook failed")

    def stats(self, worker_alive: bool, running_for_s: float) -> BatcherStats:
        """Return a snapshot of the counters with the engine's live figures."""
        with self.lock:
            in_flight = len(self._jobs)
        return self.tally.snapshot(in_flight, worker_alive, running_for_s)

    def watch(self, round_: Callable[[], None]) -> None:
        """Start the monitor thread: round_ every POLL_S until close; a failing round is logged, not fatal."""
        self._monitor = threading.Thread(target=self._watch, args=(round_,), name=f"{self._name}-monitor",
                                         daemon=True)
        self._monitor.start()

    def close(self, timeout: float, stop_engine: Callable[[float], None]) -> None:
        """Refuse new items, let those in flight finish until timeout, fail the rest, stop the monitor, then call
        stop_engine with the seconds left (at least a few polls, so threads waiting on a queue notice)."""
        until = time.monotonic() + timeout
        with self.lock:
            if self._closed and self._stop.is_set():
                return
            self._closed = True
            self._drained.wait_for(lambda: not self._jobs, timeout=max(0.0, until - time.monotonic()))
            left = list(self._jobs.values())
        for job in left:
            settle(job.future, error=BatcherClosed("batcher closed before the item ran"))
        self._stop.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(max(until - time.monotonic(), 4 * POLL_S))
        stop_engine(max(until - time.monotonic(), 4 * POLL_S))

    def _counted(self, now: float) -> None:
        """Tell on_count the number in flight (caller holds the lock)."""
        if self._on_count is not None:
            self._on_count(now, len(self._jobs))

    def _release(self, job: Job[T, R], future: Future[R]) -> None:
        """Release a resolved job's slot (a job cancelled before it ran: its waiter gave up at its deadline)."""
        if future.cancelled():
            self.tally.expired()
        with self.lock:
            self._jobs.pop(job.task_id, None)
            self._counted(time.monotonic())
            if not self._jobs:
                self._drained.notify_all()
        if self._on_release is not None:
            self._on_release(job)

    def _watch(self, round_: Callable[[], None]) -> None:
        while not self._stop.wait(POLL_S):
            try:
                round_()
            except Exception:
                logger.exception("%s monitor failed a round", self._name)
