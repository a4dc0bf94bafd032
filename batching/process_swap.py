"""The process engine's model swap: each worker process replaced in turn by one that built the new model, so that the
others answer meanwhile (issue 47; `ProcessBatcher.swap_model` is the entry point).

For each slot in turn: a new process starts on the same queues with the new init arguments and builds its model
beside the old ones (which go on taking batches); once it is ready it takes the slot, and the old process of the slot
is asked to stop after its batch (its answers still reach the collector: same output queue) and waited for, so that
once the swap returns no process of the old model takes a question. A batch runs wholly in one process, so on one
model. If a new process exits before it is ready, it is the swap that fails: the slots
already swapped are swapped back the same way, so that every process answers with the model served before, and the
error is raised.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from service_streamer.service_streamer import mp

from batching import core
from batching.errors import BatcherError
from batching.process_worker import GuardedWorker

__all__ = ["swap_slots"]

logger = logging.getLogger("batching.process")
STOP_WAIT_S = 30.0  # how long an old process may take to finish its batch and exit before it is killed


def swap_slots(streamer: Any, init_kwargs: dict[str, Any], ready_timeout_s: float) -> None:
    """Replace every worker process of `streamer` (a `batching.process._Streamer`) in turn by one built with
    `init_kwargs`; raise BatcherError, with the old model served again, when one fails to build."""
    old_args = streamer._worker_args
    new_args = (*old_args[:4], dict(init_kwargs))
    swapped: list[int] = []
    for slot in range(streamer.worker_num):
        try:
            _swap_slot(streamer, slot, _worker(streamer, new_args), ready_timeout_s)
        except BatcherError:
            for back in swapped:
                try:
                    _swap_slot(streamer, back, _worker(streamer, old_args), ready_timeout_s)
                except BatcherError:
                    logger.exception("worker %d could not be swapped back to the model served before", back)
            raise
        swapped.append(slot)
    streamer._worker_args = new_args  # a set started later (after a crash) builds the new model too
    streamer._worker = _worker(streamer, new_args)


def _worker(streamer: Any, args: tuple[Any, ...]) -> GuardedWorker:
    """A worker on the streamer's current queues, with these (model_class, batch, wait, init args, init kwargs)."""
    model_class, max_batch_size, max_wait_s, init_args, init_kwargs = args
    return GuardedWorker(model_class, max_batch_size, max_wait_s, streamer._input_queue, streamer._output_queue,
                         init_args, init_kwargs)


def _swap_slot(streamer: Any, slot: int, worker: GuardedWorker, ready_timeout_s: float) -> None:
    """Start `worker` in a new process beside the slot's, wait until it is ready, give it the slot, retire the old."""
    gpu_id = streamer.cuda_devices[slot % len(streamer.cuda_devices)] if streamer.cuda_devices else None
    ready, destroy = mp.Event(), mp.Event()
    process = mp.Process(target=worker.run_forever, args=(gpu_id, ready, destroy),
                         name=f"{streamer._name}-worker-{slot}", daemon=True)
    process.start()
    until = time.monotonic() + ready_timeout_s
    while not ready.wait(core.POLL_S):
        if not process.is_alive() or time.monotonic() >= until:
            reason = (f"exited with code {process.exitcode}" if not process.is_alive()
                      else f"not ready after {ready_timeout_s:g} s")
            process.kill()
            process.join(2.0)
            raise BatcherError(f"a worker process building the new model {reason}")
    old, old_destroy = streamer._worker_ps[slot], streamer._worker_destroy_events[slot]
    streamer._worker_ps[slot] = process
    streamer._worker_ready_events[slot] = ready
    streamer._worker_destroy_events[slot] = destroy
    old_destroy.set()  # it stops after its batch, whose answers still reach the collector
    _reap(old)  # waited for: once the swap returns, no process of the old model takes a question


def _reap(process: Any) -> None:
    process.join(STOP_WAIT_S)
    if process.is_alive():
        logger.warning("retired worker %s did not stop in time; killing it", process.pid)
        process.kill()
        process.join(2.0)
