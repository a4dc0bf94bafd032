"""The threaded engine: single items batched into calls of a plain ``list -> list`` function on one worker thread.

The engine is service-streamer 0.1.2's ``ThreadedStreamer``: its input queue and one worker thread that gathers
batches from it. Each item has one future, settled on the worker thread; the library's output side (a second
future per item in ``_future_cache``, an output queue and a collector thread that resolves those futures) is not
used (``_Streamer``). Its known defects are made harmless here and on the worker thread
(``batching.threaded_worker``); the lifecycle it shares with the process engine is ``batching.core``'s:

1. an exception in the batch function killed the worker thread: the batch function is wrapped so it never raises,
   and a worker thread that dies anyway (a ``BaseException``) is replaced by a monitor thread;
2. a caller that timed out left its future in ``_future_cache`` forever, and
3. ``_input`` incremented ``_task_id`` without a lock: both belong to the output side, which is not used (as is
   the collector thread, which polled forever and could not be stopped); items are numbered by ``itertools.count``;
4. the queues were unbounded: at most ``max_in_flight`` items are admitted, past that ``submit`` raises;
5. items past their deadline still reached the batch function: they are dropped first;
6. the batch window could reach twice ``max_latency``: the window is bounded by ``max_wait_s``.

Contract (in the manner of Ray Serve's ``batching.py``):

- What starts a batch. With ``policy="adaptive"`` (the default), under light load a request that finds the batch
  function free starts a batch at once, requests arriving while a batch runs form the next batch, and the next
  batch is held open only while a new request is expected (measured arrival gap) soon enough to be worth the
  wait. Under heavy load (on average at least half a batch in the batcher) the window holds for a full batch
  instead (or for as many as were recently in the batcher at once), until the stream pauses: full batches cost
  the least per item; unless the items waiting came at a steady rate too slow to fill it in time (open loop).
  Either way no window stays open past ``max_wait_s`` after it opened nor past the oldest deadline minus the
  measured run time of such a batch, and when more than ``max_batch_size`` wait, the batch groups items of
  similar ``size_of`` around the oldest (``batching.policy``). With ``policy="fixed"`` a batch starts when
  ``max_batch_size`` items wait or ``max_wait_s`` after the first was taken, whichever comes first:
  service-streamer's window, bounded.
- Deadlines. ``deadline`` is an absolute ``time.monotonic()``. An item whose deadline passes before its batch starts
  is not run: its future fails with ``DeadlineExceeded``, within about ``POLL_S`` even if the worker is busy.
  An item already running is not interrupted: it resolves when its batch returns, late.
- Failure. If the batch function raises, or returns a result count that differs from its input count, every item
  of that batch (and only that batch) fails with ``BatchFailed``; the worker goes on to the next batch. If the worker
  thread dies, the items it held fail with ``BatchFailed`` and a new worker takes the queue.
- Thread safety. ``submit``, ``stats``, ``alive`` and ``close`` may be called from any thread. Each future is
  resolved once, by whoever comes first: the worker thread (answers, failures, deadlines), the monitor thread
  (deadlines), the closing thread, or a ``submit`` that finds the worker dead (its items). Done-callbacks run
  there and must be quick (they may call ``submit``). A waiter that cancels its future before its batch starts
  takes the item out of the batch.
- Shutdown. ``close`` refuses new items (``BatcherClosed``), lets items in flight finish until its timeout, fails
  the rest with ``BatcherClosed``, and stops the threads. A batch function that never returns keeps its (daemon)
  thread, but no waiter is left without an answer.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from queue import Queue
from typing import Any, Generic, TypeVar

from service_streamer.service_streamer import ThreadedStreamer

from batching.core import Core, Job, settle, validate_limits
from batching.errors import BatcherStats, BatchFailed, BatchReport
from batching.policy import RunTimes, Traffic
from batching.threaded_worker import BatchRunner, BatchWorker, WorkerConfig, serve
from config import BATCH_POLICIES

__all__ = ["Batcher"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)


class _Streamer(ThreadedStreamer):
    """ThreadedStreamer's input side: its queue, and a worker thread that can be replaced.

    Read from service-streamer 0.1.2. ``ThreadedStreamer.__init__`` builds a plain ``ThreadedWorker`` and starts its
    thread at once, so it cannot be given another worker: this ``__init__`` repeats its few lines with the worker
    built by ``make_worker``. The library's output side is not used: its ``submit``/``_input`` make a second future
    per item (``_future_cache``) that a collector thread resolves with what the batch function returns, through an
    output queue. Here each item has one future, its job's, settled on the batch thread itself; ``queue`` puts the
    job on the input queue with ``_send_request``, no collector thread is started, and nothing comes back through a
    queue. tests/batching/test_batcher.py pins the library members this relies on.
    """

    def __init__(self, make_worker: Callable[[Queue[Any], threading.Event], BatchWorker], name: str) -> None:
        super(ThreadedStreamer, self).__init__()  # _BaseStreamer's: a client id; its collector thread stays unstarted
        self._name = name
        self._input_queue: Queue[Any] = Queue()
        self._worker_destroy_event = threading.Event()
        self._make_worker = make_worker
        self._task_ids = itertools.count()
        self.start_worker()

    def start_worker(self) -> None:
        """Start a fresh worker thread on the input queue."""
        self._worker = self._make_worker(self._input_queue, self._worker_destroy_event)
        self._worker_thread = threading.Thread(
            target=serve, args=(self._worker,), name=f"{self._name}-worker", daemon=True
        )
        self._worker_thread.start()

    def worker_alive(self) -> bool:
        """Say whether the current worker thread is running."""
        return self._worker_thread.is_alive()

    def running_for_s(self) -> float:
        """Return how long the current batch has been running; 0.0 when none is."""
        since = self._worker.running_since
        return 0.0 if since is None else time.monotonic() - since

    def queue(self, job: Job[Any, Any]) -> int:
        """Put one job on the input queue and return its id (next() on a count is atomic: ids never collide)."""
        task_id = next(self._task_ids)
        self._send_request(task_id, 0, job)
        return task_id

    def queued_jobs(self) -> set[Job[Any, Any]]:
        """Return the jobs still in the input queue, i.e. not yet taken by any worker."""
        with self._input_queue.mutex:
            return {message[3] for message in self._input_queue.queue}

    def stop(self, timeout: float) -> None:
        """Stop the worker after its current batch, waiting up to timeout."""
        self._worker_destroy_event.set()
        if self._worker_thread is not threading.current_thread():  # close() may be called from a done-callback
            self._worker_thread.join(timeout)


class Batcher(Generic[T, R]):
    """Batch single items into calls of fn on one worker thread; see the module docstring for the contract.

    ``on_batch(report)`` is called once per run of fn, with its size, run time and each item's queue wait, on the
    worker thread before any of its waiters wakes; a hook that raises is logged and ignored.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], list[R]],
        *,
        max_batch_size: int = 64,
        max_wait_s: float = 0.15,
        max_in_flight: int = 1024,
        policy: str = "adaptive",
        size_of: Callable[[T], int] | None = None,
        name: str = "batcher",
        on_batch: Callable[[BatchReport], None] | None = None,
        stuck_after_s: float = 10.0,
    ) -> None:
        _validate(max_batch_size, max_wait_s, max_in_flight, policy, stuck_after_s)
        self._config = WorkerConfig(max_batch_size, max_wait_s, policy, group_by_size=size_of is not None)
        self._size_of = size_of
        self._name = name
        self._max_in_flight = max_in_flight
        self._stuck_after_s = stuck_after_s
        self._run_times = RunTimes()
        self._traffic = Traffic()
        self._core: Core[T, R] = Core(max_in_flight=max_in_flight, name=name, on_batch=on_batch,
                                      on_count=self._traffic.note_count)
        self._runner: BatchRunner[T, R] = BatchRunner(fn, self._core, self._run_times)
        self._streamer = _Streamer(self._new_worker, name)
        self._core.watch(self._watch_round)

    @property
    def streamer(self) -> ThreadedStreamer:
        """The service-streamer object underneath (for inspection: its input queue and worker thread)."""
        return self._streamer

    def submit(self, item: T, deadline: float) -> Future[R]:
        """Queue one item for a batch and return the future that will hold its result or error."""
        self._revive_worker()
        size = self._size_of(item) if self._size_of is not None else 0
        return self._core.submit(item, deadline, self._enqueue, size)

    def in_flight(self) -> int:
        """Items admitted and not yet resolved."""
        return self._core.in_flight()

    def loading(self) -> bool:
        """Never: the one worker thread runs the model built before the batcher started (a dead one is revived by
        `submit` itself)."""
        return False

    def alive(self) -> bool:
        """Say whether the batcher is open, its worker thread runs, and no batch has run past stuck_after_s."""
        return (not self._core.closed and self._streamer.worker_alive()
                and self._streamer.running_for_s() <= self._stuck_after_s)

    def stats(self) -> BatcherStats:
        """Return a snapshot of the counters."""
        return self._core.stats(self._streamer.worker_alive(), self._streamer.running_for_s())

    def describe(self) -> dict[str, Any]:
        """Describe the engine for ``GET /``: its kind and settings."""
        return {"engine": "threaded", "name": self._name, "policy": self._config.policy,
                "max_batch_size": self._config.max_batch_size, "max_wait_s": self._config.max_wait_s,
                "max_in_flight": self._max_in_flight}

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new items, let those in flight finish until timeout, fail the rest, and stop the threads."""
        self._revive_worker()  # items queued behind a dead worker can still finish
        self._core.close(timeout, self._streamer.stop)

    def __enter__(self) -> Batcher[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _enqueue(self, job: Job[T, R]) -> int:
        """Queue an admitted job (under the core's lock, which serialises the arrival estimate too)."""
        self._traffic.note_arrival(job.enqueued_at)
        return self._streamer.queue(job)

    def _new_worker(self, requests: Queue[Any], destroy: threading.Event) -> BatchWorker:
        """Build a worker that shares this batcher's measurements and counters."""
        return BatchWorker(self._runner, self._config, self._core, self._run_times, self._traffic, requests, destroy)

    def _watch_round(self) -> None:
        """Replace a dead worker and expire waiting items whose deadline passed (monitor thread, every poll)."""
        self._revive_worker()
        # Items not yet running: waiters hear at their deadline even while a batch hangs.
        for job in self._core.overdue():
            self._core.expire_unstarted(job)

    def _revive_worker(self) -> None:
        """Start a new worker if the thread died, failing the items the dead one had taken off the queue."""
        if self._streamer.worker_alive():
            return
        with self._core.lock:
            if self._core.closed or self._streamer.worker_alive():
                return
            queued = self._streamer.queued_jobs()
            lost = [job for job in self._core.jobs_held() if job not in queued]
            self._streamer.start_worker()
            self._core.tally.restarted()
        logger.error("batch worker thread was dead; restarted it and failed %d items it held", len(lost))
        for job in lost:
            settle(job.future, error=BatchFailed("batch worker thread died before answering"))


def _validate(max_batch_size: int, max_wait_s: float, max_in_flight: int, policy: str, stuck_after_s: float) -> None:
    """Reject settings the batcher cannot honour."""
    validate_limits(max_batch_size, max_wait_s, max_in_flight)
    if policy not in BATCH_POLICIES:
        raise ValueError(f"policy must be one of {BATCH_POLICIES}, got {policy!r}")
    if stuck_after_s <= 0:
        raise ValueError(f"stuck_after_s must be > 0, got {stuck_after_s}")
