"""Dynamic batching over several worker processes: service-streamer 0.1.2's process-based ``Streamer``.

For machines with several GPUs or many cores: ``worker_num`` spawned processes, each building its own model from a
``ManagedModel`` class (``ImportedModel`` builds any class named by import path), placed round robin on
``cuda_devices``. The public interface is ``batching.Batcher``'s (``submit(item, deadline) -> Future``, ``alive()``,
``stats()``, ``describe()``, ``close()``, one ``on_batch`` hook), and so is the lifecycle (``batching.core``). The
library's defects are made as harmless as the threaded engine's, here and in each worker process
(``batching.process_worker``):

1. an exception in the model's ``predict`` killed the worker process: the worker calls it inside ``run_guarded``,
   which answers every item of a failed batch with a failure marker; a process that dies anyway (a crash, an OOM
   kill) is replaced by the monitor thread;
2. a caller that timed out left its future in ``_future_cache`` forever: the library's futures are dropped at once,
   every resolved item forgets its entry, and an item no worker ever answers fails ``late_grace_s`` after its
   deadline;
3. ``_input`` incremented ``_task_id`` without a lock: ids are taken under the core's lock;
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
  gives up by its own timeout (``future.result(timeout)``, as ``api.answers`` does). An item already running is not
  interrupted: its late answer still resolves its future (``api.answers`` keeps it for the retry).
- Failure. If ``predict`` raises, returns a result count that differs from its input count, or returns results that
  cannot be pickled, every item of that batch (and only that batch) fails with ``BatchFailed``; the worker goes on.
  If a worker process dies (even killed with SIGKILL while it held a shared queue's lock), the monitor replaces
  every worker on fresh queues (``WorkerSet.replace_all``) and fails every item in flight with ``BatchFailed`` at
  once; ``alive()`` is false until the new set has built its models. An item no worker answers otherwise fails
  ``late_grace_s`` after its deadline.
- Thread safety. ``submit``, ``stats``, ``alive`` and ``close`` may be called from any thread. Futures are resolved on
  the collector, monitor or closing thread, so done-callbacks run there and must be quick. A future is marked running
  once its item is queued, so ``cancel()`` returns False and never discards an answer.
- Model swap. ``swap_model(init_kwargs)`` replaces the worker processes one at a time by ones built with the new
  arguments, each once its replacement is ready, so the others answer meanwhile (``batching.process_set``).
- Shutdown. ``close`` refuses new items (``BatcherClosed``), lets items in flight finish until its timeout, fails the
  rest with ``BatcherClosed``, asks the workers to stop, and terminates those that do not within the timeout.
- Pickling. Items, init arguments and results cross process boundaries: they must pickle, and the model class must be
  importable by its module path (the ``spawn`` start method imports it afresh in each worker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from service_streamer.managed_model import ManagedModel
from service_streamer.service_streamer import Streamer

from batching import core
from batching.core import Core, Job, failure, settle, validate_limits
from batching.errors import BatcherError, BatcherStats, BatchFailed, BatchReport
from batching.process_set import WorkerSet
from batching.process_worker import EXPIRED, FAILED, Answer, ImportedModel, run_guarded

__all__ = ["ImportedModel", "ProcessBatcher", "run_guarded"]  # the worker side re-exported: one import for users

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)


class ProcessBatcher(Generic[T, R]):
    """Batch single items into calls of a ManagedModel's predict in worker processes; see the module docstring.

    ``on_result(value, batch_size)`` turns a worker's result into the future's result (default: the value).
    ``on_batch(report)`` is called once per batch run, with its size, run time and each item's queue wait (from
    its submit to the start of its batch), on the collector thread before any of its waiters wakes.
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
        on_batch: Callable[[BatchReport], None] | None = None,
        late_grace_s: float = 1.0,
        ready_timeout_s: float = 300.0,
        name: str = "batcher",
    ) -> None:
        _validate(model_class, worker_num, max_batch_size, max_wait_s, max_in_flight, late_grace_s)
        self._on_result = on_result
        self._late_grace_s = late_grace_s
        self._core: Core[T, R] = Core(max_in_flight=max_in_flight, name=name, on_batch=on_batch)
        devices = [str(d) for d in cuda_devices] if cuda_devices else None  # ManagedModel ignores a falsy id like 0
        self._description = {"engine": "process", "name": name, "workers": worker_num, "cuda_devices": devices or [],
                             "model": model_class.__name__, "init": dict(model_init_kwargs or {}),
                             "max_batch_size": max_batch_size, "max_wait_s": max_wait_s,
                             "max_in_flight": max_in_flight}
        worker_args = (model_class, max_batch_size, max_wait_s, tuple(model_init_args), dict(model_init_kwargs or {}))
        self._streamer = WorkerSet(worker_args, worker_num, devices, self._deliver, name)
        self._answering = False  # a worker has its model built (see loading); False while a generation loads
        self._swapping = threading.Lock()  # a model swap and the monitor's replacement of a dead set, one at a time
        try:
            self._wait_until_ready(ready_timeout_s)
        except BaseException:
            self._core.close(0.0, lambda _left: self._streamer.stop(timeout=2.0))
            raise
        self._core.watch(self._watch_round)

    @property
    def streamer(self) -> Streamer:
        """The service-streamer object underneath (for inspection: its worker processes and future cache)."""
        return self._streamer

    def submit(self, item: T, deadline: float) -> Future[R]:
        """Queue one item for a batch and return the future that will hold its result or error."""
        return self._core.submit(item, deadline, self._enqueue)

    def in_flight(self) -> int:
        """Items admitted and not yet resolved."""
        return self._core.in_flight()

    def loading(self) -> bool:
        """Say whether no worker process can answer because a set is loading: true from a replacement until the new
        generation is ready (seconds), when a question queued would wait out its deadline. Cheap when false: the
        processes are looked at only until one is ready after a start or a replacement."""
        if not self._answering:
            self._answering = self._streamer.ready_count() > 0
        return not self._answering and not self._core.closed

    def alive(self) -> bool:
        """Say whether the batcher is open, its collector runs, and every worker is up with its model (a worker
        being replaced makes it false until the new set is ready)."""
        return (not self._core.closed and self._streamer.collector_alive()
                and self._streamer.ready_count() == self._streamer.worker_num)

    def stats(self) -> BatcherStats:
        """Return a snapshot of the counters (running_for_s is not known across processes: always 0.0)."""
        return self._core.stats(self._streamer.ready_count() > 0, 0.0)

    def describe(self) -> dict[str, Any]:
        """Describe the engine for ``GET /``: its kind, workers, devices, the model they built and the settings."""
        return dict(self._description)

    def worker_pids(self) -> list[int | None]:
        """Return the process id of each worker slot."""
        return self._streamer.worker_pids()

    def swap_model(self, model_init_kwargs: dict[str, Any], ready_timeout_s: float = 300.0) -> None:
        """Serve the model `model_init_kwargs` builds: each worker process replaced in turn, the others answering
        meanwhile (`batching.process_set.WorkerSet.swap`); raises BatcherError, the model served before kept, when
        it fails."""
        with self._swapping:
            self._streamer.swap(model_init_kwargs, ready_timeout_s)
            self._description["init"] = dict(model_init_kwargs)

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new items, let those in flight finish until timeout, fail the rest, and stop the workers."""
        # The core joins the monitor before stopping the workers, so no process is started behind close's back.
        self._core.close(timeout, lambda left: self._streamer.stop(max(left, 1.0)))

    def __enter__(self) -> ProcessBatcher[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _enqueue(self, job: Job[T, R]) -> int:
        """Queue an admitted job for the worker processes and mark it running: it cannot be taken back, so a waiter's
        cancel() fails and the answer, however late, still resolves the future."""
        task_id = self._streamer.queue((job.deadline, job.item))
        job.future.set_running_or_notify_cancel()
        return task_id

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
            time.sleep(core.POLL_S)

    def _deliver(self, task_ids: tuple[int, ...], answers: list[Answer]) -> None:
        """Report a worker's batch, then resolve the jobs it answered (collector thread); answers for resolved jobs
        are dropped."""
        jobs = [self._core.job(task_id) for task_id in task_ids]
        ran = [(job, answer) for job, answer in zip(jobs, answers, strict=True) if answer.kind != EXPIRED]
        if ran:
            first = ran[0][1]
            self._core.report(BatchReport(
                size=first.batch_size, run_s=first.run_s, failed=first.kind == FAILED,
                queue_wait_s=tuple(answer.started_at - job.enqueued_at for job, answer in ran if job is not None),
            ))
        for job, answer in zip(jobs, answers, strict=True):
            if job is not None:
                self._resolve(job, answer)

    def _resolve(self, job: Job[T, R], answer: Answer) -> None:
        """Resolve one job with its worker's answer."""
        if answer.kind == EXPIRED:
            self._core.expire(job)
        elif answer.kind == FAILED:
            settle(job.future, error=failure(answer.error))
        elif self._on_result is None:
            settle(job.future, result=answer.value)
        else:
            try:
                result = self._on_result(answer.value, answer.batch_size)
            except Exception as exc:
                settle(job.future, error=failure(f"on_result failed: {exc!r}", exc))
                return
            settle(job.future, result=result)

    def _watch_round(self) -> None:
        """Replace the workers when one died, and fail items no worker answered in time (monitor thread, every
        poll)."""
        # close() joins the monitor before it stops the workers, so no process is started behind its back.
        dead = self._streamer.dead_slots()
        if dead and not self._core.closed and self._swapping.acquire(blocking=False):  # after a swap under way
            try:
                self._replace_dead(dead)
            finally:
                self._swapping.release()
        # Their worker died, or the queue stalled.
        for job in self._core.overdue(self._late_grace_s):
            if settle(job.future, error=BatchFailed(f"no worker answered within {self._late_grace_s:g} s "
                                                    "of the deadline")):
                self._core.tally.expired()

    def _replace_dead(self, dead: list[tuple[int, int | None]]) -> None:
        """A worker died: start a new set on fresh queues and fail every item in flight."""
        self._answering = False
        self._streamer.replace_all()  # see WorkerSet.replace_all: a dead process may hold a queue's lock
        self._answering = False  # a caller may have seen the old generation ready meanwhile
        self._core.tally.restarted()
        dropped = 0
        for job in self._core.jobs():  # queued for or held by the old generation: never answered now
            dropped += settle(job.future, error=BatchFailed("a worker process died; its generation was replaced"))
        slot, code = dead[0]
        logger.error("worker process %d exited with code %s; started a new set of %d workers", slot, code,
                     self._streamer.worker_num, extra={"fields": {"event": "worker_died", "slot": slot,
                                                                    "exit_code": code, "items_failed": dropped}})


def _validate(model_class: type, worker_num: int, max_batch_size: int, max_wait_s: float, max_in_flight: int,
              late_grace_s: float) -> None:
    """Reject settings the batcher cannot honour."""
    if not (isinstance(model_class, type) and issubclass(model_class, ManagedModel)):
        raise ValueError(f"model_class must be a ManagedModel subclass, got {model_class!r}")
    if worker_num < 1:
        raise ValueError(f"worker_num must be >= 1, got {worker_num}")
    validate_limits(max_batch_size, max_wait_s, max_in_flight)
    if late_grace_s < 0:
        raise ValueError(f"late_grace_s must be >= 0, got {late_grace_s}")
