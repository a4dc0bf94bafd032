"""Dynamic batching of single requests into calls of a plain ``list -> list`` batch function.

The engine is service-streamer 0.1.2's ``ThreadedStreamer`` (one worker thread fed by an input queue). Its known
defects are made harmless here:

1. an exception in the batch function killed the worker thread: the batch function is wrapped so it never raises,
   and a worker thread that dies anyway (a ``BaseException``) is replaced by a monitor thread;
2. a caller that timed out left its future in ``_future_cache`` forever: every finished item forgets its entry;
3. ``_input`` incremented ``_task_id`` without a lock: ``_input`` runs under a lock;
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
  similar ``size_of`` around the oldest. With ``policy="fixed"`` a batch starts when ``max_batch_size`` items wait
  or ``max_wait_s`` after the first was taken, whichever comes first: service-streamer's window, bounded.
- Deadlines. ``deadline`` is an absolute ``time.monotonic()``. An item whose deadline passes before its batch starts
  is not run: its future fails with ``DeadlineExceeded``, within about ``_POLL_S`` even if the worker is busy.
  An item already running is not interrupted: it resolves when its batch returns, late.
- Failure. If the batch function raises, or returns a result count that differs from its input count, every item
  of that batch (and only that batch) fails with ``BatchFailed``; the worker goes on to the next batch. If the worker
  thread dies, the items it held fail with ``BatchFailed`` and a new worker takes the queue.
- Thread safety. ``submit``, ``stats``, ``alive`` and ``close`` may be called from any thread. Futures are resolved
  on the worker, monitor or closing thread, so done-callbacks run there and must be quick (they may call
  ``submit``). A waiter that cancels its future before its batch starts takes the item out of the batch.
- Shutdown. ``close`` refuses new items (``BatcherClosed``), lets items in flight finish until its timeout, fails
  the rest with ``BatcherClosed``, and stops the threads. A batch function that never returns keeps its (daemon)
  thread, but no waiter is left without an answer.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from queue import Empty, Queue
from typing import Any, Generic, TypeVar

from service_streamer.service_streamer import ThreadedStreamer, ThreadedWorker

__all__ = [
    "BatchFailed",
    "Batcher",
    "BatcherClosed",
    "BatcherError",
    "BatcherStats",
    "DeadlineExceeded",
    "Overloaded",
]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)

# How often idle threads wake to notice deadlines, a dead worker or close(); also the worst added expiry delay.
_POLL_S = 0.05
# Weight of the newest sample in the run-time and arrival-gap averages.
_EWMA_ALPHA = 0.3
# An idle spell longer than this says nothing more about traffic; capping it lets the gap estimate recover.
_GAP_CAP_S = 1.0
# Time constants of the load average (mean number of items in the batcher, waiting or running): it follows a
# rise within a fraction of a second and a fall over about a second, so heavy load switches the throughput mode
# on at once and a short lull does not switch it off. A wrong switch costs little: the hold ends when arrivals
# pause (_PATIENCE_GAPS) and never passes a deadline.
_LOAD_RISE_TAU_S = 0.2
_LOAD_FALL_TAU_S = 1.0
# Above this share of max_batch_size in the load average, full batches are within reach: hold for them.
_FULL_LOAD_SHARE = 0.5
# In throughput mode, how many expected arrival gaps of silence end the wait (the stream has paused).
_PATIENCE_GAPS = 10.0
# ... and at least this share of the batch's run time: the wait costs latency, not throughput, and a pause of a
# few gaps is often only the scheduler (two cores shared with the request threads), not the stream's end.
_PATIENCE_RUN_SHARE = 0.25
# The fewest waiting items whose arrival times tell a rate.
_RATE_MIN_ITEMS = 3
# The peak number of items in the batcher is taken over the last one to two windows of this length.
_PEAK_WINDOW_S = 1.0
POLICIES = ("adaptive", "fixed")


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
class BatcherStats:
    """A snapshot of the batcher's state; counters run since it started.

    in_flight: admitted and not yet answered. batches / items: calls of the batch function and the items they
    carried. failures: batches that raised or answered the wrong count. dropped_expired: items failed with
    DeadlineExceeded. overloaded: submits refused. padded_waste: sum over batches of max_len * n - sum(len),
    by size_of. restarts: dead worker threads replaced. running_for_s: age of the running batch, 0.0 if none.
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


@dataclass(eq=False)
class _Job(Generic[T, R]):
    """One submitted item with its deadline and the future its waiter holds."""

    item: T
    deadline: float
    future: Future[R]
    size: int
    enqueued_at: float
    task_id: int = -1


@dataclass
class _Tally:
    """Counters written by the worker, the monitor and submitters, under one lock."""

    batches: int = 0
    items: int = 0
    failures: int = 0
    dropped_expired: int = 0
    overloaded: int = 0
    padded_waste: int = 0
    last_batch_size: int = 0
    restarts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add each count to the counter of that name."""
        with self.lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)

    def batch_ran(self, size: int, waste: int, failed: bool) -> None:
        """Count one call of the batch function."""
        with self.lock:
            self.batches += 1
            self.items += size
            self.failures += int(failed)
            self.padded_waste += waste
            self.last_batch_size = size


@dataclass(frozen=True)
class _Config:
    """The dispatch settings the worker needs."""

    max_batch_size: int
    max_wait_s: float
    policy: str
    group_by_size: bool


class _RunTimes:
    """EWMA of batch run time per power-of-two size bucket, from successful batches; worker thread only."""

    def __init__(self) -> None:
        self._by_bucket: dict[int, float] = {}

    def observe(self, size: int, seconds: float) -> None:
        """Fold one measured batch into its bucket's average."""
        bucket = _bucket(size)
        old = self._by_bucket.get(bucket)
        self._by_bucket[bucket] = seconds if old is None else old + _EWMA_ALPHA * (seconds - old)

    def estimate(self, size: int) -> float:
        """Return the expected run time of a batch of this size; 0.0 before any batch was measured."""
        if not self._by_bucket:
            return 0.0
        bucket = _bucket(size)
        # Nearest measured bucket, the larger on a tie: overestimating only makes the window shorter.
        nearest = min(self._by_bucket, key=lambda known: (abs(known - bucket), -known))
        return self._by_bucket[nearest]


class _Traffic:
    """What submits say about the load: the arrival gap (EWMA) and the load average (items in the batcher).

    Writers (note_arrival, note_count) are serialised by the batcher lock; the worker reads without it, so the
    load state is one tuple replaced whole.
    """

    def __init__(self) -> None:
        self.gap_s: float | None = None
        self._last: float | None = None
        self._load: tuple[float, int, float] = (time.monotonic(), 0, 0.0)  # (since, count since then, average)
        # (peak of the previous window, peak of the current window, current window's index, count now)
        self._peaks: tuple[int, int, int, int] = (0, 0, 0, 0)

    def note_arrival(self, now: float) -> None:
        """Record one arrival."""
        if self._last is not None:
            sample = min(now - self._last, _GAP_CAP_S)
            self.gap_s = sample if self.gap_s is None else self.gap_s + _EWMA_ALPHA * (sample - self.gap_s)
        self._last = now

    def note_count(self, now: float, count: int) -> None:
        """Record that the number of items in the batcher changed to count at now."""
        self._load = (now, count, self.load(now))
        previous, current, window, held = self._peaks
        index = int(now / _PEAK_WINDOW_S)
        if index != window:
            # The count held across the boundary belongs to the new window (and to a skipped one).
            previous, current, window = (current if index == window + 1 else held), held, index
        self._peaks = (previous, max(current, count), window, count)

    def peak(self, now: float) -> int:
        """Return the most items in the batcher at once over the last one to two _PEAK_WINDOW_S."""
        previous, current, window, held = self._peaks
        index = int(now / _PEAK_WINDOW_S)
        if index == window:
            return max(previous, current)
        return max(current, held) if index == window + 1 else held

    def load(self, now: float) -> float:
        """Return the recent time-average number of items in the batcher (see _LOAD_RISE_TAU_S)."""
        since, count, average = self._load
        tau = _LOAD_RISE_TAU_S if count > average else _LOAD_FALL_TAU_S
        return average + (1.0 - math.exp(-max(0.0, now - since) / tau)) * (count - average)


def _bucket(size: int) -> int:
    """Map a batch size to its bucket: 1, 2, 3-4, 5-8, ..."""
    return (max(size, 1) - 1).bit_length()


def _settle(future: Future[Any], *, result: Any = None, error: BaseException | None = None) -> bool:
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


def _expire(job: _Job[Any, Any], tally: _Tally) -> None:
    """Fail a job whose deadline passed before it ran."""
    if _settle(job.future, error=DeadlineExceeded("deadline passed before the item's batch started")):
        tally.add(dropped_expired=1)


def _start(job: _Job[Any, Any], tally: _Tally, now: float) -> bool:
    """Mark a job running if it is still wanted and in time; expire it if late."""
    if job.future.done():
        return False
    if now >= job.deadline:
        _expire(job, tally)
        return False
    try:
        return job.future.set_running_or_notify_cancel()
    except RuntimeError:
        # Resolved by the monitor or close() between the done() check and here.
        return False


def _batch_failed(cause: BaseException, size: int) -> BatchFailed:
    """Build the error one waiter of a failed batch receives (one instance per waiter: tracebacks differ)."""
    message = str(cause) if isinstance(cause, BatchFailed) else f"batch of {size} failed: {cause!r}"
    error = BatchFailed(message)
    error.__cause__ = cause
    return error


def _similar_sizes(sizes: list[int], k: int) -> list[int]:
    """Return, in arrival order, the indices of k items of similar size that include item 0 (the oldest)."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    ordered = [sizes[i] for i in order]
    prefix = [0, *accumulate(ordered)]
    oldest = order.index(0)
    starts = range(max(0, oldest - k + 1), min(oldest, len(sizes) - k) + 1)
    # In sorted order a contiguous run padded to its last (longest) item wastes k * longest - total.
    best = min(starts, key=lambda s: k * ordered[s + k - 1] - (prefix[s + k] - prefix[s]))
    return sorted(order[best : best + k])


def _padded_waste(sizes: list[int]) -> int:
    """Return the padding a batch of these sizes costs: max_len * n - sum(len)."""
    return max(sizes) * len(sizes) - sum(sizes) if sizes else 0


def _fixed_wait_s(waiting: int, opened_at: float, now: float, max_batch_size: int, max_wait_s: float) -> float:
    """Return how long service-streamer's window would still wait, bounded by max_wait_s after it opened."""
    if waiting >= max_batch_size:
        return 0.0
    return max(0.0, opened_at + max_wait_s - now)


@dataclass(frozen=True)
class _Window:
    """What the adaptive rule looks at when the batch function is free and items wait."""

    now: float
    waiting: int
    opened_at: float
    arrived_idle: bool
    earliest_deadline: float
    gap_s: float | None
    run_s_next: float
    load: float = 0.0
    peak: int = 0
    span_s: float = 0.0  # since the oldest waiting item arrived


def _adaptive_wait_s(window: _Window, max_batch_size: int, max_wait_s: float) -> float:
    """Return how long to hold the next batch open for one more request; 0.0 means dispatch now.

    Two regimes, told apart by the load average (mean number of items in the batcher). Under light load latency
    wins: an item that finds the batch function idle runs at once, and a busy stream waits one arrival gap only
    while that costs the waiting items less than the newcomer would lose by missing the batch. Under heavy load
    (at least _FULL_LOAD_SHARE of a batch in the batcher on average) throughput wins where a full batch is within
    reach: the window holds, even for an item that found the function idle (under heavy load, the first of a
    burst), until the batch is full or holds as many items as were recently in the batcher at once (its peak:
    with fewer clients than a batch, no one else is coming), until the stream pauses (_PATIENCE_GAPS gaps, at
    least _PATIENCE_RUN_SHARE of a run), or until the window must close. Full batches cost the least per item,
    and where the batch function shares the CPU with the request threads (a CPU server), a small batch run during
    an arrival burst slows both. But when the items that came during the last run arrived at a steady rate too
    slow to fill the batch in the window (open-loop load), the latency rules apply: holding would only add the
    window to every answer.
    """
    if window.waiting >= max_batch_size or window.gap_s is None:
        return 0.0
    closes_at = min(window.opened_at + max_wait_s, window.earliest_deadline - window.run_s_next)
    if window.now + window.gap_s > closes_at:
        return 0.0  # no request is expected before the window must close, so waiting cannot fill the batch
    if window.load >= _FULL_LOAD_SHARE * max_batch_size:
        target = min(max_batch_size, window.peak)
        if window.waiting >= target:
            return 0.0  # every item recently in the batcher is here: waiting cannot fill the batch
        left_s = closes_at - window.now
        # Items that came while a batch ran arrived at the stream's steady rate: hold only if that rate fills the
        # batch before the window closes. An item that found the function idle under heavy load is most often the
        # first of a burst (clients whose answers just went out), whose rate is not known yet: hold.
        steady = not window.arrived_idle and window.waiting >= _RATE_MIN_ITEMS
        rate = (window.waiting - 1) / max(window.span_s, 1e-9)
        if not steady or window.waiting + rate * left_s >= target:
            return min(max(_PATIENCE_GAPS * window.gap_s, _PATIENCE_RUN_SHARE * window.run_s_next), left_s)
    if window.arrived_idle:
        return 0.0
    # Waiting one gap delays each of the n waiting items by a gap; it spares the newcomer a whole run.
    if (window.waiting + 1) * window.gap_s >= window.run_s_next:
        return 0.0
    return window.gap_s


class _BatchRunner(Generic[T, R]):
    """The batch function as the streamer sees it: resolves every job it is given and never raises Exception."""

    def __init__(
        self,
        fn: Callable[[list[T]], list[R]],
        tally: _Tally,
        run_times: _RunTimes,
        on_batch: Callable[[int, float], None] | None,
    ) -> None:
        self._fn = fn
        self._tally = tally
        self._run_times = run_times
        self._on_batch = on_batch

    def __call__(self, jobs: list[_Job[T, R]]) -> list[None]:
        """Run the jobs still wanted and in time; return placeholders, the answers go to the futures."""
        now = time.monotonic()
        live = [job for job in jobs if _start(job, self._tally, now)]
        if live:
            self._run(live)
        return [None] * len(jobs)

    def _run(self, jobs: list[_Job[T, R]]) -> None:
        """Call the batch function once and resolve each job with its result or the batch's failure."""
        started = time.monotonic()
        try:
            results = self._call([job.item for job in jobs])
        except BaseException as exc:
            self._record(jobs, time.monotonic() - started, failed=True)
            for job in jobs:
                _settle(job.future, error=_batch_failed(exc, len(jobs)))
            if not isinstance(exc, Exception):
                raise  # SystemExit and the like end this worker; the monitor starts another
            logger.warning("batch of %d failed: %r", len(jobs), exc)
            return
        self._record(jobs, time.monotonic() - started, failed=False)
        for job, result in zip(jobs, results, strict=True):
            _settle(job.future, result=result)

    def _call(self, items: list[T]) -> list[R]:
        """Call the batch function and check it answered every item."""
        results = list(self._fn(items))
        if len(results) != len(items):
            raise BatchFailed(f"batch function returned {len(results)} results for {len(items)} items")
        return results

    def _record(self, jobs: list[_Job[T, R]], seconds: float, failed: bool) -> None:
        """Count the batch, learn its run time, and tell the on_batch hook before any waiter wakes."""
        self._tally.batch_ran(len(jobs), _padded_waste([job.size for job in jobs]), failed)
        if not failed:
            self._run_times.observe(len(jobs), seconds)
        if self._on_batch is not None:
            try:
                self._on_batch(len(jobs), seconds)
            except Exception:
                logger.exception("on_batch hook failed")


class _BatchWorker(ThreadedWorker):
    """ThreadedWorker whose batch-collection step (_run_once) keeps a waiting room and picks from it.

    The library's _run_once pulls items one by one, each with a max_latency timeout, and checks the total only
    after each pull, so its window can reach twice max_latency; it also can only take items in arrival order.
    Dispatch-when-idle, the deadline-aware window and length grouping all need to see every waiting item
    before choosing, so _run_once is the one method replaced; run_forever, _recv_request, model_predict and
    _send_response are the library's.
    """

    def __init__(
        self,
        runner: _BatchRunner[Any, Any],
        config: _Config,
        run_times: _RunTimes,
        traffic: _Traffic,
        tally: _Tally,
        requests: Queue[Any],
        responses: Queue[Any],
        destroy_event: threading.Event,
    ) -> None:
        super().__init__(
            runner, config.max_batch_size, config.max_wait_s, requests, responses, destroy_event=destroy_event
        )
        self._config = config
        self._run_times = run_times
        self._traffic = traffic
        self._tally = tally
        self._waiting: list[_Job[Any, Any]] = []
        self._opened_at = 0.0
        self._last_batch_end = float("-inf")
        self.running_since: float | None = None

    def _run_once(self) -> int:
        """Gather a batch by the configured policy, run it, and publish placeholders to the streamer."""
        self._collect(0.0 if self._waiting else _POLL_S)
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
            placeholders = self.model_predict(batch)
        finally:
            self.running_since = None
            self._last_batch_end = time.monotonic()
        for job, placeholder in zip(batch, placeholders, strict=True):
            self._send_response(0, job.task_id, 0, placeholder)
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

    def _admit(self, message: tuple[int, int, int, _Job[Any, Any]]) -> None:
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
            return _fixed_wait_s(len(self._waiting), self._opened_at, now, config.max_batch_size, config.max_wait_s)
        window = _Window(
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
        return _adaptive_wait_s(window, config.max_batch_size, config.max_wait_s)

    def _drop_settled(self, now: float) -> None:
        """Forget jobs resolved elsewhere and expire those past their deadline."""
        kept = []
        for job in self._waiting:
            if job.future.done():
                continue
            if now >= job.deadline:
                _expire(job, self._tally)
                continue
            kept.append(job)
        self._waiting = kept

    def _take_batch(self) -> list[_Job[Any, Any]]:
        """Remove the next batch from the waiting room: the oldest items, or similar sizes around the oldest."""
        self._waiting = [job for job in self._waiting if not job.future.done()]
        k = self._config.max_batch_size
        if len(self._waiting) <= k:
            batch, self._waiting = self._waiting, []
            return batch
        if self._config.policy == "adaptive" and self._config.group_by_size:
            chosen = set(_similar_sizes([job.size for job in self._waiting], k))
        else:
            chosen = set(range(k))
        batch = [job for i, job in enumerate(self._waiting) if i in chosen]
        self._waiting = [job for i, job in enumerate(self._waiting) if i not in chosen]
        return batch


def _serve(worker: _BatchWorker) -> None:
    """Run a worker's loop; a worker that dies is logged here and replaced by the monitor."""
    try:
        worker.run_forever()
    except BaseException:
        logger.exception("batch worker died")


class _Streamer(ThreadedStreamer):
    """ThreadedStreamer with a replaceable worker, a locked _input and a collector that tolerates forgotten tasks.

    ThreadedStreamer.__init__ builds a plain ThreadedWorker and starts its thread at once, so it cannot be given
    another worker; this __init__ repeats its few lines with the worker built by make_worker.
    """

    def __init__(
        self, make_worker: Callable[[Queue[Any], Queue[Any], threading.Event], _BatchWorker], name: str
    ) -> None:
        super(ThreadedStreamer, self).__init__()  # _BaseStreamer's: ids, _future_cache, collector thread
        self._name = name
        self._input_queue: Queue[Any] = Queue()
        self._output_queue: Queue[Any] = Queue()
        self._worker_destroy_event = threading.Event()
        self._input_lock = threading.Lock()
        self._collector_stop = threading.Event()
        self._make_worker = make_worker
        self.start_worker()
        self.back_thread.name = f"{name}-collect"
        self._delay_setup()

    def start_worker(self) -> None:
        """Start a fresh worker thread on the shared queues."""
        self._worker = self._make_worker(self._input_queue, self._output_queue, self._worker_destroy_event)
        self._worker_thread = threading.Thread(
            target=_serve, args=(self._worker,), name=f"{self._name}-worker", daemon=True
        )
        self._worker_thread.start()

    def worker_alive(self) -> bool:
        """Say whether the current worker thread is running."""
        return self._worker_thread.is_alive()

    def running_for_s(self) -> float:
        """Return how long the current batch has been running; 0.0 when none is."""
        since = self._worker.running_since
        return 0.0 if since is None else time.monotonic() - since

    def _input(self, batch: list[Any]) -> int:
        """Queue a batch under a lock: the library reads and bumps _task_id unlocked, so ids could collide."""
        with self._input_lock:
            return super()._input(batch)

    def _send_request(self, task_id: int, request_id: int, model_input: _Job[Any, Any]) -> None:
        """Stamp the job with its task id before the worker can see it, then queue it."""
        model_input.task_id = task_id
        super()._send_request(task_id, request_id, model_input)

    def forget(self, task_id: int) -> None:
        """Drop a finished task's future: the library drops it only when someone calls result() in time."""
        self._future_cache.pop(task_id, None)

    def queued_jobs(self) -> set[_Job[Any, Any]]:
        """Return the jobs still in the input queue, i.e. not yet taken by any worker."""
        with self._input_queue.mutex:
            return {message[3] for message in self._input_queue.queue}

    def _loop_collect_result(self) -> None:
        """Deliver responses as the library does, skipping forgotten tasks (it raised KeyError) until stopped."""
        while not self._collector_stop.is_set():
            message = self._recv_response(timeout=_POLL_S)
            if message is None:
                continue
            task_id, request_id, output = message
            future = self._future_cache.get(task_id)
            if future is not None:
                future._append_result(request_id, output)
                if future.done():
                    self.forget(task_id)

    def stop(self, timeout: float) -> None:
        """Stop the worker after its current batch and the collector, waiting up to timeout for each."""
        self._worker_destroy_event.set()
        self._collector_stop.set()
        for thread in (self._worker_thread, self.back_thread):
            if thread is not threading.current_thread():  # close() may be called from a done-callback
                thread.join(timeout)


class Batcher(Generic[T, R]):
    """Batch single items into calls of fn on one worker thread; see the module docstring for the contract."""

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
        on_batch: Callable[[int, float], None] | None = None,
        stuck_after_s: float = 10.0,
    ) -> None:
        _validate(max_batch_size, max_wait_s, max_in_flight, policy, stuck_after_s)
        self._config = _Config(max_batch_size, max_wait_s, policy, group_by_size=size_of is not None)
        self._size_of = size_of
        self._max_in_flight = max_in_flight
        self._stuck_after_s = stuck_after_s
        self._tally = _Tally()
        self._run_times = _RunTimes()
        self._traffic = _Traffic()
        self._runner: _BatchRunner[T, R] = _BatchRunner(fn, self._tally, self._run_times, on_batch)
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._jobs: set[_Job[T, R]] = set()
        self._closed = False
        self._stop = threading.Event()
        self._streamer = _Streamer(self._new_worker, name)
        self._monitor = threading.Thread(target=self._watch, name=f"{name}-monitor", daemon=True)
        self._monitor.start()

    def submit(self, item: T, deadline: float) -> Future[R]:
        """Queue one item for a batch and return the future that will hold its result or error."""
        self._revive_worker()
        size = self._size_of(item) if self._size_of is not None else 0
        now = time.monotonic()
        job: _Job[T, R] = _Job(item, deadline, Future(), size, enqueued_at=now)
        with self._lock:
            if self._closed:
                raise BatcherClosed("batcher is closed")
            if now >= deadline:
                _expire(job, self._tally)  # no callbacks yet, so resolving under the lock is safe
                return job.future
            if len(self._jobs) >= self._max_in_flight:
                self._tally.add(overloaded=1)
                raise Overloaded(f"{len(self._jobs)} items in flight, max_in_flight is {self._max_in_flight}")
            self._traffic.note_arrival(now)
            # Registered before queueing: a resolver's callback waits for this lock, so the entry is there.
            job.future.add_done_callback(partial(self._forget, job))
            self._jobs.add(job)
            self._traffic.note_count(now, len(self._jobs))
            self._streamer.submit([job])
        return job.future

    def alive(self) -> bool:
        """Say whether the batcher is open, its worker thread runs, and no batch has run past stuck_after_s."""
        return (
            not self._closed and self._streamer.worker_alive() and self._streamer.running_for_s() <= self._stuck_after_s
        )

    def stats(self) -> BatcherStats:
        """Return a snapshot of the counters."""
        with self._lock:
            in_flight = len(self._jobs)
        tally = self._tally
        with tally.lock:
            return BatcherStats(
                in_flight=in_flight,
                batches=tally.batches,
                items=tally.items,
                failures=tally.failures,
                dropped_expired=tally.dropped_expired,
                overloaded=tally.overloaded,
                padded_waste=tally.padded_waste,
                last_batch_size=tally.last_batch_size,
                worker_alive=self._streamer.worker_alive(),
                restarts=tally.restarts,
                running_for_s=self._streamer.running_for_s(),
            )

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new items, let those in flight finish until timeout, fail the rest, and stop the threads."""
        until = time.monotonic() + timeout
        self._revive_worker()  # items queued behind a dead worker can still finish
        with self._lock:
            self._closed = True
            self._drained.wait_for(lambda: not self._jobs, timeout=max(0.0, until - time.monotonic()))
            left = list(self._jobs)
        for job in left:
            _settle(job.future, error=BatcherClosed("batcher closed before the item ran"))
        self._stop.set()
        # At least a few polls, so threads that were only waiting on a queue get to notice.
        join_s = max(until - time.monotonic(), 4 * _POLL_S)
        self._streamer.stop(join_s)
        self._monitor.join(join_s)

    def __enter__(self) -> Batcher[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _new_worker(self, requests: Queue[Any], responses: Queue[Any], destroy: threading.Event) -> _BatchWorker:
        """Build a worker that shares this batcher's measurements and counters."""
        return _BatchWorker(
            self._runner, self._config, self._run_times, self._traffic, self._tally, requests, responses, destroy
        )

    def _forget(self, job: _Job[T, R], _future: Future[R]) -> None:
        """Release a resolved job's slot and its streamer future."""
        with self._lock:
            self._jobs.discard(job)
            self._traffic.note_count(time.monotonic(), len(self._jobs))
            if not self._jobs:
                self._drained.notify_all()
        self._streamer.forget(job.task_id)

    def _watch(self) -> None:
        """Every poll: replace a dead worker and expire waiting items whose deadline passed."""
        while not self._stop.wait(_POLL_S):
            try:
                self._revive_worker()
                self._expire_waiting()
            except Exception:
                logger.exception("batcher monitor failed a round")

    def _revive_worker(self) -> None:
        """Start a new worker if the thread died, failing the items the dead one had taken off the queue."""
        if self._streamer.worker_alive():
            return
        with self._lock:
            if self._closed or self._streamer.worker_alive():
                return
            queued = self._streamer.queued_jobs()
            lost = [job for job in self._jobs if job not in queued]
            self._streamer.start_worker()
            self._tally.add(restarts=1)
        logger.error("batch worker thread was dead; restarted it and failed %d items it held", len(lost))
        for job in lost:
            _settle(job.future, error=BatchFailed("batch worker thread died before answering"))

    def _expire_waiting(self) -> None:
        """Fail items not yet running whose deadline passed, so waiters hear even while a batch hangs."""
        now = time.monotonic()
        with self._lock:
            late = [job for job in self._jobs if job.deadline <= now and not job.future.running()]
        for job in late:
            _expire(job, self._tally)


def _validate(max_batch_size: int, max_wait_s: float, max_in_flight: int, policy: str, stuck_after_s: float) -> None:
    """Reject settings the batcher cannot honour."""
    _validate_limits(max_batch_size, max_wait_s, max_in_flight)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if stuck_after_s <= 0:
        raise ValueError(f"stuck_after_s must be > 0, got {stuck_after_s}")


def _validate_limits(max_batch_size: int, max_wait_s: float, max_in_flight: int) -> None:
    """Reject batch limits no batcher (threaded or process) can honour."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_wait_s < 0:
        raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
