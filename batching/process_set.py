"""The process engine's set of worker processes: service-streamer 0.1.2's process-based ``Streamer`` with a guarded
worker (``batching.process_worker``), one replaceable process per slot, and a collector that hands each batch's
answers to a callback (``batching.process.ProcessBatcher``, which owns the set, is its one user).

The set's life: its processes start at once, each building its model; a dead one makes the owner replace the whole
set on fresh queues (``replace_all``); ``swap`` serves another model, one process at a time; ``stop`` ends it.

Model swap (issue 47). For each slot in turn: a new process starts on the same queues with the new init arguments
and builds its model beside the old ones (which go on taking batches); once it is ready it takes the slot, and the
old process of the slot is asked to stop after its batch (its answers still reach the collector: same output queue)
and waited for, so that once the swap returns no process of the old model takes a question. A batch runs wholly in
one process, so on one model. If a new process exits before it is ready, it is the swap that fails: the slots
already swapped are swapped back the same way, so that every process answers with the model served before, and the
error is raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from service_streamer.service_streamer import Streamer, mp

from batching import core
from batching.errors import BatcherError
from batching.process_worker import Answer, GuardedWorker

__all__ = ["WorkerSet"]

logger = logging.getLogger("batching.process")
STOP_WAIT_S = 30.0  # how long a retired process may take to finish its batch and exit before it is killed


class WorkerSet(Streamer):
    """service-streamer's Streamer with a guarded worker, one replaceable process per slot, and a collector that
    hands each batch's answers to a callback instead of the library's futures.

    Streamer.__init__ builds a plain StreamWorker and starts its processes at once, so it cannot be given another
    worker; this __init__ repeats its few lines with GuardedWorker.
    """

    def __init__(self, worker_args: tuple[Any, ...], worker_num: int, cuda_devices: Sequence[str] | None,
                 deliver: Callable[[tuple[int, ...], list[Answer]], None], name: str) -> None:
        super(Streamer, self).__init__()  # _BaseStreamer's: ids, _future_cache, collector thread
        self.worker_num = worker_num
        self.cuda_devices = list(cuda_devices) if cuda_devices else None
        self._name = name
        self._worker_args = worker_args
        self._new_queues()
        self._worker_ps: list[Any] = [None] * worker_num
        self._worker_ready_events: list[Any] = [None] * worker_num
        self._worker_destroy_events: list[Any] = [None] * worker_num
        self._deliver = deliver
        self._collector_stop = threading.Event()
        for slot in range(worker_num):
            self.start_worker(slot)
        self.back_thread.name = f"{name}-collect"
        self._delay_setup()

    def _new_queues(self) -> None:
        """Give the workers to come a fresh pair of queues (the collector and `queue` read the attributes anew)."""
        self._input_queue = mp.Queue()
        self._output_queue = mp.Queue()
        self._worker = self._worker_on_queues(self._worker_args)

    def _worker_on_queues(self, args: tuple[Any, ...]) -> GuardedWorker:
        """A worker on the current queues, with these (model_class, batch, wait, init args, init kwargs)."""
        model_class, max_batch_size, max_wait_s, init_args, init_kwargs = args
        return GuardedWorker(model_class, max_batch_size, max_wait_s, self._input_queue, self._output_queue,
                             init_args, init_kwargs)

    def replace_all(self) -> None:
        """Stop every worker and start a fresh set on fresh queues.

        The workers share one input queue, and a reader waits in `Queue.get` holding the queue's read lock (a
        multiprocessing lock); a writer holds the output queue's write lock while it sends. A process killed there
        (SIGKILL, the OOM killer) takes the lock with it, and every other worker then waits on it forever. So no
        queue a dead process may have held is used again: the survivors are killed (whatever they held is failed
        by the caller), the old queues are left to the garbage collector (closing the output queue under the
        collector's timed `get` would break it), and a new generation starts.
        """
        for event in self._worker_destroy_events:
            event.set()
        for process in self._worker_ps:
            if process.is_alive():
                process.kill()
        for process in self._worker_ps:
            process.join(2.0)
        self._input_queue.cancel_join_thread()  # items queued for the old generation must not block exit
        self._new_queues()
        for slot in range(self.worker_num):
            self.start_worker(slot)

    def start_worker(self, slot: int) -> None:
        """Start a fresh worker process in this slot, on the slot's device."""
        self._take_slot(slot, *self._spawn(slot, self._worker))

    def swap(self, init_kwargs: dict[str, Any], ready_timeout_s: float) -> None:
        """Serve the model `init_kwargs` builds: every worker process replaced in turn (see the module docstring);
        raise BatcherError, with the model served before answering again, when one fails to build."""
        old_args = self._worker_args
        new_args = (*old_args[:4], dict(init_kwargs))
        swapped: list[int] = []
        for slot in range(self.worker_num):
            try:
                self._swap_slot(slot, self._worker_on_queues(new_args), ready_timeout_s)
            except BatcherError:
                for back in swapped:
                    try:
                        self._swap_slot(back, self._worker_on_queues(old_args), ready_timeout_s)
                    except BatcherError:
                        logger.exception("worker %d could not be swapped back to the model served before", back)
                raise
            swapped.append(slot)
        self._worker_args = new_args  # a set started later (after a crash) builds the new model too
        self._worker = self._worker_on_queues(new_args)

    def _spawn(self, slot: int, worker: GuardedWorker) -> tuple[Any, Any, Any]:
        """Start `worker` in a new process on the slot's device; return it with its ready and destroy events."""
        gpu_id = self.cuda_devices[slot % len(self.cuda_devices)] if self.cuda_devices else None
        ready, destroy = mp.Event(), mp.Event()
        process = mp.Process(target=worker.run_forever, args=(gpu_id, ready, destroy),
                             name=f"{self._name}-worker-{slot}", daemon=True)
        process.start()
        return process, ready, destroy

    def _take_slot(self, slot: int, process: Any, ready: Any, destroy: Any) -> None:
        self._worker_ps[slot] = process
        self._worker_ready_events[slot] = ready
        self._worker_destroy_events[slot] = destroy

    def _swap_slot(self, slot: int, worker: GuardedWorker, ready_timeout_s: float) -> None:
        """Start `worker` beside the slot's process, wait until it is ready, give it the slot, retire the old."""
        process, ready, destroy = self._spawn(slot, worker)
        until = time.monotonic() + ready_timeout_s
        while not ready.wait(core.POLL_S):
            if not process.is_alive() or time.monotonic() >= until:
                reason = (f"exited with code {process.exitcode}" if not process.is_alive()
                          else f"not ready after {ready_timeout_s:g} s")
                process.kill()
                process.join(2.0)
                raise BatcherError(f"a worker process building the new model {reason}")
        old, old_destroy = self._worker_ps[slot], self._worker_destroy_events[slot]
        self._take_slot(slot, process, ready, destroy)
        old_destroy.set()  # it stops after its batch, whose answers still reach the collector
        _reap(old)  # waited for: once the swap returns, no process of the old model takes a question

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
        """Hand each batch's answers to deliver until stopped (the library's loop raised KeyError on a forgotten
        task)."""
        while not self._collector_stop.is_set():
            message = self._recv_response(timeout=core.POLL_S)
            if message is None:
                continue
            try:
                self._deliver(*message)
            except Exception:
                logger.exception("delivering a worker's answers failed")

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
            self.back_thread.join(max(until - time.monotonic(), 4 * core.POLL_S))
        for q in (self._input_queue, self._output_queue):
            q.cancel_join_thread()  # items left for dead workers must not block the interpreter's exit
            q.close()


def _reap(process: Any) -> None:
    process.join(STOP_WAIT_S)
    if process.is_alive():
        logger.warning("retired worker %s did not stop in time; killing it", process.pid)
        process.kill()
        process.join(2.0)
