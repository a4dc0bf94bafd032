"""Micro-batching of single requests into calls of a plain ``list -> list`` function; knows nothing of models.

``Batcher`` (``batching.threaded``) runs the function on one worker thread with an adaptive window
(``batching.policy``); ``ProcessBatcher`` (``batching.process``, imported on demand: it spawns processes) runs a
model class in worker processes. Both share one lifecycle (``batching.core``): admission up to ``max_in_flight``,
deadlines, one ``on_batch(BatchReport)`` hook per batch, ``stats()``, ``alive()``, ``describe()`` and ``close()``.
Both are service-streamer 0.1.2 underneath, with its defects made harmless (docs/architecture.md,
"service-streamer's defects").
"""

from batching.errors import (
    BatcherClosed,
    BatcherError,
    BatcherStats,
    BatchFailed,
    BatchReport,
    DeadlineExceeded,
    Overloaded,
)
from batching.threaded import Batcher

__all__ = [
    "BatchFailed",
    "BatchReport",
    "Batcher",
    "BatcherClosed",
    "BatcherError",
    "BatcherStats",
    "DeadlineExceeded",
    "Overloaded",
]
