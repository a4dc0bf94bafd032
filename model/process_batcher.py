"""Dynamic batching over several worker processes: service-streamer 0.1.2's process-based ``Streamer``.

For machines with several GPUs or many cores: ``worker_num`` spawned processes, each building its own model from a
``ManagedModel`` class (``ImportedModel`` builds any class named by import path), placed round robin on
``cuda_devices``. The public interface is ``model.batcher.Batcher``'s: ``submit(item, deadline) -> Future``,
``alive()``, ``stats()``, ``close()``. The library's defects are made as harmless as the threaded batcher's:

1. an exception in the model's ``predict`` killed the worker process: the worker calls it inside ``run_guarded``,
   which answers every item of a failed batch with a failure marker; a process that dies anyway (a crash, an OOM
   kill) is replaced by the monitor thread;
2. a caller that timed out left its future in ``_future_cache`` forever: the library's futures are dropped at once,
   every resolved item forgets its entry, and an item no worker ever answers fails ``late_grace_s`` after its
   deadline;
3. ``_input`` incremented ``_task_id`` without a lock: ids are taken under the batcher's lock;
4. the queues were unbounded: at most ``max_in_flight`` items are admitted, past that ``submit`` raises;
5. items past their deadline still reached the model: a worker drops them when it takes them;
6. the batch window could reach twice ``max_latency``: it is bounded by ``max_wait_s``;
7. also: readiness was never awaited (the constructor waits until every worker has built its model, or raises), a
   worker outlived a parent killed with SIGKILL (it exits when it is orphaned), and Ctrl-C in the terminal killed
   workers mid-batch (they ignore SIGINT; the parent stops them).

Contract:

- What starts a batch. A free worker takes the oldest queued item, then waits up to ``max_wait_s`` for more, until
  ``max_batch_size`` (service-streamer's window, bounded); items already queued when the window closes join too, up
  to ``max_batch_size``. Workers compete for one queue, so there is no adaptive policy: keep ``max_wait_s`` small.
- Deadlines. ``deadline`` is an absolute ``time.monotonic()``; Linux's monotonic clock is one clock for every process,
  so workers compare it with their own. An item whose deadline has passed when a worker takes it is not run: its
  future fails with ``DeadlineExceeded``. A queued item cannot be taken back from the other process, so a waiter
  gives up by its own timeout (``future.result(timeout)``, as ``api.predict`` does). An item already running is not
  interrupted: its late answer still resolves its future (``api.predict`` keeps it for the retry).
- Failure. If ``predict`` raises, returns a result count that differs from its input count, or returns results that
  cannot be pickled, every item of that batch (and only that batch) fails with ``BatchFailed``; the worker goes on.
  If a worker process dies, the monitor starts another on the same device; the items it held fail with
  ``BatchFailed`` ``late_grace_s`` after their deadline.
- Thread safety. ``submit``, ``stats``, ``alive`` and ``close`` may be called from any thread. Futures are resolved on
  the collector, monitor or closing thread, so done-callbacks run there and must be quick. Cancelling a future only
  discards its answer.
- Shutdown. ``close`` refuses new items (``BatcherClosed``), lets items in flight finish until its timeout, fails the
  rest with ``BatcherClosed``, asks the workers to stop, and terminates those that do not within the timeout.
- Pickling. Items, init arguments and results cross process boundaries: they must pickle, and the model class must be
  importable by its module path (the ``spawn`` start method imports it afresh in each worker).
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from queue import Empty
from typing import Any, Generic, TypeVar

from service_streamer.managed_model import ManagedModel
from service_streamer.service_streamer import Streamer, StreamWorker, mp

from model.batcher import (
    BatcherClosed,
    BatcherError,
    BatcherStats,
    BatchFailed,
    DeadlineExceeded,
    Overloaded,
    _settle,
    _Tally,  # the same counters as the threaded batcher
    _validate_limits,
)

__all__ = ["ImportedModel", "ProcessBatcher", "run_guarded"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)

# How often the worker, collector and monitor wake to notice a stop, an orphaning or a dead worker.
_POLL_S = 0.05
_OK, _FAILED, _EXPIRED = "ok", "failed", "expired"


@dataclass(frozen=True)
class _Answer:
    """What a worker sends back for one item: its result, or why it has none, and the batch it came in."""

    kind: str
    value: Any = None
    error: str = ""
    batch: tuple[int, int] = (0, 0)  # (worker pid, batch number in that worker); (0, 0) when no batch ran
    batch_size: int = 0
    started_at: float = 0.0  # time.monotonic() in the worker when the batch started
    run_s: float = 0.0


def run_guarded(predict: Callable[[list[Any]], list[Any]], batch: list[tuple[float, Any]],
                batch_no: int = 0) -> list[_Answer]:
    """Run the items of (deadline, item) pairs still in time through predict; never raise an Exception.

    Returns one answer per pair, in order: "expired" for items past their deadline, else "ok" with the result, or
    "failed" for every item when predict raised, miscounted, or answered with something that does not pickle.
    """
    started = time.monotonic()
    answers = [_Answer(_EXPIRED)] * len(batch)
    live = [i for i, (deadline, _) in enumerate(batch) if deadline > started]
    if not live:
        return answers
    key = (os.getpid(), batch_no)
    try:
        results = list(predict([batch[i][1] for i in live]))
        if len(results) != len(live):
            raise BatchFailed(f"batch function returned {len(results)} results for {len(live)} items")
        pickle.dumps(results)  # an unpicklable result would be lost in the queue's feeder thread, unanswered
    except Exception as exc:
        failed = _Answer(_FAILED, error=f"batch of {len(live)} failed: {exc!r}", batch=key, batch_size=len(live),
                         started_at=started, run_s=time.monotonic() - started)
        logger.warning("batch of %d failed in worker %d: %r", len(live), key[0], exc)
        for i in live:
            answers[i] = failed
        return answers
    run_s = time.monotonic() - started
    for i, result in zip(live, results, strict=True):
        answers[i] = _Answer(_OK, result, batch=key, batch_size=len(live), started_at=started, run_s=run_s)
    return answers


class ImportedModel(ManagedModel):
    """A ManagedModel built from an import path, so the server process names a model without importing it.

    ``init_model(target="package.module:Factory", kwargs={...}, setup="setup", method="predict_batch", env={...})``
    sets ``env`` first (``OMP_NUM_THREADS`` must be set before torch is imported), builds ``Factory(**kwargs)``,
    calls its ``setup`` method (if named) and predicts with its ``method``.
    """

    def init_model(self, target: str, kwargs: dict[str, Any] | None = None, setup: str | None = "setup",
                   method: str = "predict_batch", env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})
        module_name, _, name = target.partition(":")
        factory = getattr(importlib.import_module(module_name), name)
        self.model = factory(**(kwargs or {}))
        if setup:
            getattr(self.model, setup)()
        self._predict = getattr(self.model, method)

    def predict(self, batch: list[Any]) -> list[Any]:
        return self._predict(batch)


class _GuardedWorker(StreamWorker):
    """StreamWorker whose batch step (_run_once) is bounded, drops late items and never lets predict raise.

    run_forever (model init, ready event) and the queue methods are the library's; this object is pickled into each
    spawned process.
    """

    def __init__(self, model_class: type[ManagedModel], max_batch_size: int, max_wait_s: float,
                 requests: Any, responses: Any, init_args: Sequence[Any], init_kwargs: dict[str, Any]) -> None:
        super().__init__(model_class, max_batch_size, max_wait_s, requests, responses, list(init_args), init_kwargs)
        self._parent_pid = os.getpid()
        self._batches = 0

    def run_forever(self, gpu_id: str | None = None, ready_event: Any = None, destroy_event: Any = None) -> None:
        """Build the model, then serve batches until the parent sets destroy_event or dies."""
        # Ctrl-C reaches the whole process group; the parent decides when its workers stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        super().run_forever(gpu_id, ready_event, destroy_event)

    def _run_once(self) -> int:
        """Take a batch (oldest item, then up to max_wait_s for more), run it guarded, send one answer per item."""
        if os.getppid() != self._parent_pid:
            raise SystemExit(0)  # orphaned (the server was killed): nobody will read the answers
        try:
            batch = [self._recv_request(timeout=_POLL_S)]
        except TimeoutError:
            return 0
        closes_at = time.monotonic() + self._max_latency
        while len(batch) < self._batch_size:
            left = closes_at - time.monotonic()
            try:
                batch.append(self._recv_request(timeout=left) if left > 0 else self._request_queue.get_nowait())
            except (TimeoutError, Empty):
                break
        self._batches += 1
        answers = run_guarded(self._predict, [message[3] for message in batch], self._batches)
        for (client_id, task_id, request_id, _), answer in zip(batch, answers, strict=True):
            self._send_response(client_id, task_id, request_id, answer)
        return len(batch)


@dataclass(eq=False)
class _Job:
    """One submitted item as the server process tracks it."""

    deadline: float
    future: Future[Any]
    enqueued_at: float
    task_id: int = -1


class _Streamer(Streamer):
    """service-streamer's Streamer with a guarded worker, one replaceable process per slot, and a collector that
    hands answers to a callback instead of the library's futures.

    Streamer.__init__ builds a plain StreamWorker and starts its processes at once, so it cannot be given another
    worker; this __init__ repeats its few lines with _GuardedWorker.
    """

    def __init__(self, worker_args: tuple[Any, ...], worker_num: int, cuda_devices: Sequence[str] | None,
                 deliver: Callable[[int, _Answer], None], name: str) -> None:
        super(Streamer, self).__init__()  # _BaseStreamer's: ids, _future_cache, collector thread
        self.worker_num = worker_num
        self.cuda_devices = list(cuda_devices) if cuda_devices else None
        self._name = name
        self._input_queue = mp.Queue()
        self._output_queue = mp.Queue()
        model_class, max_batch_size, max_wait_s, init_args, init_kwargs = worker_args
        self._worker = _GuardedWorker(model_class, max_batch_size, max_wait_s, self._input_queue,
                                      self._output_queue, init_args, init_kwargs)
        self._worker_ps: list[Any] = [None] * worker_num
        self._worker_ready_events: list[Any] = [None] * worker_num
        self._worker_destroy_events: list[Any] = [None] * worker_num
        self._deliver = deliver
        self._collector_stop = threading.Event()
        for slot in range(worker_num):
            self.start_worker(slot)
        self.back_thread.name = f"{name}-collect"
        self._delay_setup()

    def start_worker(self, slot: int) -> None:
        """Start a fresh worker process in this slot, on the slot's device."""
        gpu_id = self.cuda_devices[slot % len(self.cuda_devices)] if self.cuda_devices else None
        ready, destroy = mp.Event(), mp.Event()
        process = mp.Process(target=self._worker.run_forever, args=(gpu_id, ready, destroy),
                             name=f"{self._name}-worker-{slot}", daemon=True)
        process.start()
        self._worker_ps[slot] = process
        self._worker_ready_events[slot] = ready
        self._worker_destroy_events[slot] = destroy

    def dead_slots(self) -> list[tuple[int, int | None]]:
        """Return (slot, exit code) of every worker process that has exited."""
        return [(slot, p.exitcode) for slot, p in enumerate(self._worker_ps) if not p.is_alive()]

    def ready_count(self) -> int:
        """Count the worker processes alive with their model built."""
        return sum(1 for p, ready in zip(self._worker_ps, self._worker_ready_events, strict=True)
                   if p.is_alive() and ready.is_set())

    def worker_pids(self) -> list[int | None]:
        return [p.pid for p in self._worker_ps]

    def queue(self, payload: tuple[float, Any]) -> int:
        """Send one (deadline, item) to the workers; return its task id. Callers serialise this (the library's
        _input reads and bumps _task_id unlocked)."""
        task_id = self._input([payload])
        self._future_cache.pop(task_id, None)  # answers go to the batcher's jobs, never to the library's futures
        return task_id

    def collector_alive(self) -> bool:
        return self.back_thread.is_alive()

    def _loop_collect_result(self) -> None:
        """Hand each answer to deliver until stopped (the library's loop raised KeyError on a forgotten task)."""
        while not self._collector_stop.is_set():
            message = self._recv_response(timeout=_POLL_S)
            if message is None:
                continue
            task_id, _request_id, answer = message
            try:
                self._deliver(task_id, answer)
            except Exception:
                logger.exception("delivering a worker's answer failed")

    def stop(self, timeout: float) -> None:
        """Ask every worker to stop, terminate those still running at timeout, and stop the collector."""
        until = time.monotonic() + timeout
        for event in self._worker_destroy_events:
            event.set()
        for process in self._worker_ps:
            process.join(max(0.0, until - time.monotonic()))
        for process in self._worker_ps:
            if process.is_alive():
                logger.warning("worker %s did not stop in time; terminating it", process.pid)
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        self._collector_stop.set()
        if self.back_thread is not threading.current_thread():
            self.back_thread.join(max(until - time.monotonic(), 4 * _POLL_S))
        for q in (self._input_queue, self._output_queue):
            q.cancel_join_thread()  # items left for dead workers must not block the interpreter's exit
            q.close()


class ProcessBatcher(Generic[T, R]):
    """Batch single items into calls of a ManagedModel's predict in worker processes; see the module docstring.

    ``on_result(value, batch_size)`` turns a worker's result into the future's result (default: the value).
    ``on_batch(size, seconds)`` is called once per batch run, ``on_queue_wait(seconds)`` once per item that ran, with
    the time from its submit to the start of its batch; both on the collector thread.
    """

    def __init__(
        self,
        model_class: type[ManagedModel],
        *,
        model_init_args: Sequence[Any] = (),
        model_init_kwargs: dict[str, Any] | None = None,
        worker_num: int = 2,
        cuda_devices: Sequence[str] | None = None,
        max_batch_size: int = 64,
        max_wait_s: float = 0.02,
        max_in_flight: int = 1024,
        on_result: Callable[[Any, int], R] | None = None,
        on_batch: Callable[[int, float], None] | None = None,
        on_queue_wait: Callable[[float], None] | None = None,
        late_grace_s: float = 1.0,
        ready_timeout_s: float = 300.0,
        name: str = "batcher",
    ) -> None:
        _validate(model_class, worker_num, max_batch_size, max_wait_s, max_in_flight, late_grace_s)
        self._max_in_flight = max_in_flight
        self._on_result = on_result
        self._on_batch = on_batch
        self._on_queue_wait = on_queue_wait
        self._late_grace_s = late_grace_s
        self._tally = _Tally()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._jobs: dict[int, _Job] = {}
        self._last_batch: dict[int, int] = {}  # worker pid -> last batch number reported to on_batch
        self._closed = False
        self._stop = threading.Event()
        worker_args = (model_class, max_batch_size, max_wait_s, tuple(model_init_args), dict(model_init_kwargs or {}))
        devices = [str(d) for d in cuda_devices] if cuda_devices else None  # ManagedModel ignores a falsy id like 0
        self._streamer = _Streamer(worker_args, worker_num, devices, self._deliver, name)
        try:
            self._wait_until_ready(ready_timeout_s)
        except BaseException:
            self._closed = True
            self._streamer.stop(timeout=2.0)
            raise
        self._monitor = threading.Thread(target=self._watch, name=f"{name}-monitor", daemon=True)
        self._monitor.start()

    def submit(self, item: T, deadline: float) -> Future[R]:
        """Queue one item for a batch and return the future that will hold its result or error."""
        now = time.monotonic()
        job = _Job(deadline, Future(), enqueued_at=now)
        with self._lock:
            if self._closed:
                raise BatcherClosed("batcher is closed")
            if now >= deadline:
                self._tally.add(dropped_expired=1)
                job.future.set_exception(DeadlineExceeded("deadline passed before the item's batch started"))
                return job.future
            if len(self._jobs) >= self._max_in_flight:
                self._tally.add(overloaded=1)
                raise Overloaded(f"{len(self._jobs)} items in flight, max_in_flight is {self._max_in_flight}")
            # Under the lock: ids never collide, and the collector (which takes the lock) finds the job registered.
            job.task_id = self._streamer.queue((deadline, item))
            self._jobs[job.task_id] = job
        job.future.add_done_callback(partial(self._forget, job.task_id))
        return job.future

    def alive(self) -> bool:
        """Say whether the batcher is open, its collector runs, and at least one worker is up with its model."""
        return not self._closed and self._streamer.collector_alive() and self._streamer.ready_count() > 0

    def stats(self) -> BatcherStats:
        """Return a snapshot of the counters (running_for_s is not known across processes: always 0.0)."""
        with self._lock:
            in_flight = len(self._jobs)
        tally = self._tally
        with tally.lock:
            return BatcherStats(
                in_flight=in_flight, batches=tally.batches, items=tally.items, failures=tally.failures,
                dropped_expired=tally.dropped_expired, overloaded=tally.overloaded, padded_waste=0,
                last_batch_size=tally.last_batch_size, worker_alive=self._streamer.ready_count() > 0,
                restarts=tally.restarts, running_for_s=0.0,
            )

    def worker_pids(self) -> list[int | None]:
        """Return the process id of each worker slot."""
        return self._streamer.worker_pids()

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new items, let those in flight finish until timeout, fail the rest, and stop the workers."""
        until = time.monotonic() + timeout
        with self._lock:
            if self._closed and self._stop.is_set():
                return
            self._closed = True
            self._drained.wait_for(lambda: not self._jobs, timeout=max(0.0, until - time.monotonic()))
            left = list(self._jobs.values())
        for job in left:
            _settle(job.future, error=BatcherClosed("batcher closed before the item ran"))
        self._stop.set()
        self._monitor.join(max(until - time.monotonic(), 4 * _POLL_S))
        self._streamer.stop(max(until - time.monotonic(), 1.0))

    def __enter__(self) -> ProcessBatcher[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_until_ready(self, timeout_s: float) -> None:
        """Wait until every worker has built its model; raise if one exits first or the timeout passes."""
        until = time.monotonic() + timeout_s
        while self._streamer.ready_count() < self._streamer.worker_num:
            dead = self._streamer.dead_slots()
            if dead:
                slot, code = dead[0]
                raise BatcherError(f"worker {slot} exited with code {code} while building its model")
            if time.monotonic() >= until:
                raise BatcherError(f"workers not ready after {timeout_s:g} s")
            time.sleep(_POLL_S)

    def _deliver(self, task_id: int, answer: _Answer) -> None:
        """Resolve the job a worker answered (collector thread); an answer for a resolved job is dropped."""
        self._report_batch(answer)
        with self._lock:
            job = self._jobs.get(task_id)
        if job is None:
            return
        if answer.kind == _OK:
            if self._on_queue_wait is not None:
                self._call_hook(self._on_queue_wait, answer.started_at - job.enqueued_at)
            try:
                result = answer.value if self._on_result is None else self._on_result(answer.value, answer.batch_size)
            except Exception as exc:
                _settle(job.future, error=_failed(f"on_result failed: {exc!r}", exc))
                return
            _settle(job.future, result=result)
        elif answer.kind == _EXPIRED:
            if _settle(job.future, error=DeadlineExceeded("deadline passed before the item's batch started")):
                self._tally.add(dropped_expired=1)
        else:
            _settle(job.future, error=_failed(answer.error))

    def _report_batch(self, answer: _Answer) -> None:
        """Count a batch and call on_batch, once per batch: on the first answer seen from it."""
        pid, number = answer.batch
        if number == 0 or self._last_batch.get(pid) == number:
            return
        self._last_batch[pid] = number
        failed = answer.kind == _FAILED
        with self._tally.lock:
            self._tally.batches += 1
            self._tally.items += answer.batch_size
            self._tally.failures += int(failed)
            self._tally.last_batch_size = answer.batch_size
        if self._on_batch is not None:
            self._call_hook(self._on_batch, answer.batch_size, answer.run_s)

    def _forget(self, task_id: int, _future: Future[Any]) -> None:
        """Release a resolved job's slot."""
        with self._lock:
            self._jobs.pop(task_id, None)
            if not self._jobs:
                self._drained.notify_all()

    def _watch(self) -> None:
        """Every poll: replace dead workers and fail items no worker answered in time."""
        while not self._stop.wait(_POLL_S):
            try:
                self._revive_workers()
                self._fail_lost()
            except Exception:
                logger.exception("process batcher monitor failed a round")

    def _revive_workers(self) -> None:
        """Start a new process in the slot of each worker that died."""
        # close() joins this thread before it stops the workers, so no process is started behind its back.
        for slot, code in self._streamer.dead_slots():
            if self._closed:
                return
            self._streamer.start_worker(slot)
            self._tally.add(restarts=1)
            logger.error("worker process %d exited with code %s; started another", slot, code)

    def _fail_lost(self) -> None:
        """Fail items still unanswered late_grace_s after their deadline (their worker died, or the queue stalled)."""
        now = time.monotonic()
        with self._lock:
            lost = [job for job in self._jobs.values() if job.deadline + self._late_grace_s <= now]
        for job in lost:
            if _settle(job.future, error=BatchFailed(f"no worker answered within {self._late_grace_s:g} s "
                                                     "of the deadline")):
                self._tally.add(dropped_expired=1)

    @staticmethod
    def _call_hook(hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            logger.exception("batcher hook failed")


def _failed(message: str, cause: BaseException | None = None) -> BatchFailed:
    error = BatchFailed(message)
    error.__cause__ = cause
    return error


def _validate(model_class: type, worker_num: int, max_batch_size: int, max_wait_s: float, max_in_flight: int,
              late_grace_s: float) -> None:
    """Reject settings the batcher cannot honour."""
    if not (isinstance(model_class, type) and issubclass(model_class, ManagedModel)):
        raise ValueError(f"model_class must be a ManagedModel subclass, got {model_class!r}")
    if worker_num < 1:
        raise ValueError(f"worker_num must be >= 1, got {worker_num}")
    _validate_limits(max_batch_size, max_wait_s, max_in_flight)
    if late_grace_s < 0:
        raise ValueError(f"late_grace_s must be >= 0, got {late_grace_s}")
