"""What runs inside each worker process of the process engine: the model built from an import path, the guarded
batch step, and the answers it sends back (one message per batch).

``batching.process`` owns the streamer and the public ``ProcessBatcher``; this module is what each spawned process
runs (and imports afresh: keep it light).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pkgutil import resolve_name
from queue import Empty
from typing import Any

from service_streamer.managed_model import ManagedModel
from service_streamer.service_streamer import StreamWorker

from batching import core
from batching.errors import BatchFailed
from sidecar.heap import HeapTrimmer

__all__ = ["EXPIRED", "FAILED", "OK", "Answer", "GuardedWorker", "ImportedModel", "run_guarded"]

# The process engine's logger: failures in workers and in the server are logged under one name.
logger = logging.getLogger("batching.process")

OK, FAILED, EXPIRED = "ok", "failed", "expired"


@dataclass(frozen=True)
class Answer:
    """What a worker sends back for one item: its result, or why it has none, and the batch it ran in."""

    kind: str
    value: Any = None
    error: str = ""
    batch_size: int = 0
    started_at: float = 0.0  # time.monotonic() in the worker when the batch started
    run_s: float = 0.0


def run_guarded(predict: Callable[[list[Any]], list[Any]], batch: list[tuple[float, Any]]) -> list[Answer]:
    """Run the items of (deadline, item) pairs still in time through predict; never raise an Exception.

    Returns one answer per pair, in order: "expired" for items past their deadline, else "ok" with the result, or
    "failed" for every item when predict raised, miscounted, or answered with something that does not pickle.
    """
    started = time.monotonic()
    answers = [Answer(EXPIRED)] * len(batch)
    live = [i for i, (deadline, _) in enumerate(batch) if deadline > started]
    if not live:
        return answers
    try:
        results = list(predict([batch[i][1] for i in live]))
        if len(results) != len(live):
            raise BatchFailed(f"batch function returned {len(results)} results for {len(live)} items")
        pickle.dumps(results)  # an unpicklable result would be lost in the queue's feeder thread, unanswered
    except Exception as exc:
        failed = Answer(FAILED, error=f"batch of {len(live)} failed: {exc!r}", batch_size=len(live),
                         started_at=started, run_s=time.monotonic() - started)
        logger.warning("batch of %d failed in worker %d: %r", len(live), os.getpid(), exc)
        for i in live:
            answers[i] = failed
        return answers
    run_s = time.monotonic() - started
    for i, result in zip(live, results, strict=True):
        answers[i] = Answer(OK, result, batch_size=len(live), started_at=started, run_s=run_s)
    return answers


class ImportedModel(ManagedModel):
    """A ManagedModel built from an import path, so the server process names a model without importing it.

    ``init_model(target="package.module:Factory", kwargs={...}, env={...})`` sets ``env`` first (``OMP_NUM_THREADS``
    must be set before torch is imported), builds ``Factory(**kwargs)``, calls its ``setup()`` and predicts with its
    ``predict_batch``.
    """

    def init_model(self, target: str, kwargs: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})
        self.model = resolve_name(target)(**(kwargs or {}))
        self.model.setup()
        self._predict: Callable[[list[Any]], list[Any]] = self.model.predict_batch

    def predict(self, batch: list[Any]) -> list[Any]:
        return self._predict(batch)


class GuardedWorker(StreamWorker):
    """StreamWorker whose batch step (_run_once) is bounded, drops late items, never lets predict raise, and sends
    one message per batch (so the server reports the batch once, with every item's queue wait).

    run_forever (model init, ready event) and the queue methods are the library's; this object is pickled into each
    spawned process.
    """

    def __init__(self, model_class: type[ManagedModel], max_batch_size: int, max_wait_s: float,
                 requests: Any, responses: Any, init_args: Sequence[Any], init_kwargs: dict[str, Any]) -> None:
        super().__init__(model_class, max_batch_size, max_wait_s, requests, responses, list(init_args), init_kwargs)
        self._parent_pid = os.getpid()

    def run_forever(self, gpu_id: str | None = None, ready_event: Any = None, destroy_event: Any = None) -> None:
        """Build the model, then serve batches until the parent sets destroy_event or dies."""
        # Ctrl-C reaches the whole process group; the parent decides when its workers stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._heap = HeapTrimmer()  # made in the spawned process: its C function does not pickle
        super().run_forever(gpu_id, ready_event, destroy_event)

    def _run_once(self) -> int:
        """Take a batch (oldest item, then up to max_wait_s for more), run it guarded, send its answers at once."""
        if os.getppid() != self._parent_pid:
            raise SystemExit(0)  # orphaned (the server was killed): nobody will read the answers
        try:
            batch = [self._recv_request(timeout=core.POLL_S)]
        except TimeoutError:
            return 0
        closes_at = time.monotonic() + self._max_latency
        while len(batch) < self._batch_size:
            left = closes_at - time.monotonic()
            try:
                batch.append(self._recv_request(timeout=left) if left > 0 else self._request_queue.get_nowait())
            except (TimeoutError, Empty):
                break
        answers = run_guarded(self._predict, [message[3] for message in batch])
        self._response_queue.put((tuple(message[1] for message in batch), answers))
        self._heap.after_batch()  # the answers are sent: give back what the batch freed (sidecar.heap)
        return len(batch)
