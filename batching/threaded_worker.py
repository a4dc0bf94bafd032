"""The threaded engine's worker thread: the waiting room that forms batches by the policy, and the runner that calls
the batch function so that every job is resolved and nothing escapes but a ``BaseException``.

``batching.threaded`` owns the streamer and the public ``Batcher``; this module is what runs on its worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from queue import Empty, Queue
from typing import Any, Generic, TypeVar

from service_streamer.service_streamer import ThreadedWorker

from batching import core
from batching.core import Core, Job, failure, settle
from batching.errors import BatchFailed, BatchReport
from batching.policy import RunTimes, Traffic, Window, adaptive_wait_s, fixed_wait_s, padded_waste, similar_sizes
from sidecar.heap import HeapTrimmer

__all__ = ["BatchRunner", "BatchWorker", "WorkerConfig", "serve"]

T = TypeVar("T")
R = TypeVar("R")

# The threaded engine's logger: its batch failures and dead workers are logged under one name.
logger = logging.getLogger("batching.threaded")


@dataclass(frozen=True)
class WorkerConfig:
    """The dispatch settings the worker needs."""

    max_batch_size: int
    max_wait_s: float
    policy: str
    group_by_size: bool


class BatchRunner(Generic[T, R]):
    """The batch function as the streamer sees it: resolves every job it is given and never raises Exception."""

    def __init__(self, fn: Callable[[list[T]], list[R]], lifecycle: Core[T, R], run_times: RunTimes) -> None:
        self._fn = fn
        self._core = lifecycle
        self._run_times = run_times

    def __call__(self, jobs: list[Job[T, R]]) -> None:
        """Run the jobs still wanted and in time, settling each one's future with its answer or the failure."""
        now = time.monotonic()
        live = [job for job in jobs if self._core.start(job, now)]
        if live:
            self._run(live)

    def _run(self, jobs: list[Job[T, R]]) -> None:
        """Call the batch function once and resolve each job with its result or the batch's failure."""
        started = time.monotonic()
        try:
            results = self._call([job.item for job in jobs])
        except BaseException as exc:
            self._record(jobs, started, failed=True)
            message = str(exc) if isinstance(exc, BatchFailed) else f"batch of {len(jobs)} failed: {exc!r}"
            for job in jobs:
                settle(job.future, error=failure(message, exc))
            if not isinstance(exc, Exception):
                raise  # SystemExit and the like end this worker; the monitor starts another
            logger.warning("batch of %d failed: %r", len(jobs), exc)
            return
        self._record(jobs, started, failed=False)
        for job, result in zip(jobs, results, strict=True):
            settle(job.future, result=result)

    def _call(self, items: list[T]) -> list[R]:
        """Call the batch function and check it answered every item."""
        results = list(self._fn(items))
        if len(results) != len(items):
            raise BatchFailed(f"batch function returned {len(results)} results for {len(items)} items")
        return results

    def _record(self, jobs: list[Job[T, R]], started: float, failed: bool) -> None:
        """Learn the batch's run time and report it before any waiter wakes."""
        seconds = time.monotonic() - started
        if not failed:
            self._run_times.observe(len(jobs), seconds)
        self._core.report(BatchReport(
            size=len(jobs), run_s=seconds, queue_wait_s=tuple(started - job.enqueued_at for job in jobs),
            failed=failed, padded_waste=padded_waste([job.size for job in jobs]),
        ))


class BatchWorker(ThreadedWorker):
    """ThreadedWorker whose batch-collection step (_run_once) keeps a waiting room and picks from it.

    The library's _run_once pulls items one by one, each with a max_latency timeout, and checks the total only
    after each pull, so its window can reach twice max_latency; it also can only take items in arrival order.
    Dispatch-when-idle, the deadline-aware window and length grouping all need to see every waiting item
    before choosing, so _run_once is the one method replaced; run_forever, _recv_request and model_predict are the
    library's. The runner settles each job's future itself, so the worker sends nothing back (no response queue).
    """

    def __init__(self, runner: BatchRunner[Any, Any], config: WorkerConfig, lifecycle: Core[Any, Any],
                 run_times: RunTimes, traffic: Traffic, requests: Queue[Any], destroy_event: threading.Event) -> None:
        super().__init__(runner, config.max_batch_size, config.max_wait_s, requests, None, destroy_event=destroy_event)
        self._config = config
        self._core = lifecycle
        self._run_times = run_times
        self._traffic = traffic
        self._waiting: list[Job[Any, Any]] = []
        self._opened_at = 0.0
        self._last_batch_end = float("-inf")
        self._heap = HeapTrimmer()
        self.running_since: float | None = None

    def _run_once(self) -> int:
        """Gather a batch by the configured policy and run it (the runner settles each job's future)."""
        self._collect(0.0 if self._waiting else core.POLL_S)
        if not self._waiting:
            return 0
        self._opened_at = time.monotonic()
        while (wait_s := self._wait_s()) > 0 and self._collect(wait_s):
            pass
        batch = self._take_batch()
        if not batch:
            return 0
        self.running_since = time.monotonic()
        try:
            self.model_predict(batch)
        finally:
            self.running_since = None
            self._last_batch_end = time.monotonic()
        self._heap.after_batch()  # the answers are out: give back what the batch freed (sidecar.heap)
        return len(batch)

    def _collect(self, timeout: float) -> bool:
        """Wait up to timeout for one request, then take all already queued; say whether any came."""
        try:
            self._admit(self._recv_request(timeout=timeout))
        except TimeoutError:
            return False
        try:
            while True:
                self._admit(self._request_queue.get_nowait())
        except Empty:
            return True

    def _admit(self, message: tuple[int, int, int, Job[Any, Any]]) -> None:
        """Move one streamer message into the waiting room unless its job was already resolved."""
        job = message[3]
        if not job.future.done():
            self._waiting.append(job)

    def _wait_s(self) -> float:
        """Return how long the next batch should stay open; 0.0 dispatches now."""
        now = time.monotonic()
        self._drop_settled(now)
        if not self._waiting:
            return 0.0
        config = self._config
        if config.policy == "fixed":
            return fixed_wait_s(len(self._waiting), self._opened_at, now, config.max_batch_size, config.max_wait_s)
        window = Window(
            now=now,
            waiting=len(self._waiting),
            opened_at=self._opened_at,
            arrived_idle=self._waiting[0].enqueued_at >= self._last_batch_end,
            earliest_deadline=min(job.deadline for job in self._waiting),
            gap_s=self._traffic.gap_s,
            run_s_next=self._run_times.estimate(min(len(self._waiting) + 1, config.max_batch_size)),
            load=self._traffic.load(now),
            peak=self._traffic.peak(now),
            span_s=now - self._waiting[0].enqueued_at,
        )
        return adaptive_wait_s(window, config.max_batch_size, config.max_wait_s)

    def _drop_settled(self, now: float) -> None:
        """Forget jobs resolved elsewhere and expire those past their deadline."""
        kept = []
        for job in self._waiting:
            if job.future.done():
                continue
            if now >= job.deadline:
                self._core.expire(job)
                continue
            kept.append(job)
        self._waiting = kept

    def _take_batch(self) -> list[Job[Any, Any]]:
        """Remove the next batch from the waiting room: the oldest items, or similar sizes around the oldest."""
        self._waiting = [job for job in self._waiting if not job.future.done()]
        k = self._config.max_batch_size
        if len(self._waiting) <= k:
            batch, self._waiting = self._waiting, []
            return batch
        if self._config.policy == "adaptive" and self._config.group_by_size:
            chosen = set(similar_sizes([job.size for job in self._waiting], k))
        else:
            chosen = set(range(k))
        batch = [job for i, job in enumerate(self._waiting) if i in chosen]
        self._waiting = [job for i, job in enumerate(self._waiting) if i not in chosen]
        return batch


def serve(worker: BatchWorker) -> None:
    """Run a worker's loop; a worker that dies is logged here and replaced by the monitor."""
    try:
        worker.run_forever()
    except BaseException:
        logger.exception("batch worker died")
