"""What crosses the service's layers, named in one place: the corrector's protocol, the engine's, and their data.

Here in `hosting/`, not in `batching/` or `model/`, because the host is the one room that meets both: it wraps the
corrector (`model.corrector.Corrector`, or a fake in tests) into the engine's plain `list -> list` batch
function, and the API asks the engine (`batching.Batcher` or `batching.process.ProcessBatcher`) for answers. Neither
of those imports this module: they satisfy the protocols by their shape, so the batch layer still knows nothing
about models and the model nothing about HTTP. Every member either protocol has is listed, so no caller guesses
with `getattr`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from batching import BatcherStats
from preprocess.text import NBest, han_chars


class Corrector(Protocol):
    """The model as the API uses it (`model.corrector.Corrector`): set up once, then batches of questions."""

    @property
    def ready(self) -> bool:
        """True once `setup()` has returned: weights loaded and warmed up."""
        ...

    @property
    def info(self) -> dict[str, Any]:
        """Describe the model for `GET /`."""
        ...

    def setup(self) -> None:
        """Load the weights and run a warm-up batch."""
        ...

    def predict_batch(self, items: list[NBest]) -> list[str]:
        """Answer each question, one answer per item, in order."""
        ...


class Engine(Protocol):
    """The batching engine as the API uses it (`batching.Batcher`, `batching.process.ProcessBatcher`)."""

    def submit(self, item: NBest, deadline: float) -> Future[Prediction]:
        """Queue one question, due by `deadline` (time.monotonic()); raises Overloaded or BatcherClosed."""
        ...

    def alive(self) -> bool:
        """True while the engine is open, a worker runs, and no batch is stuck."""
        ...

    def in_flight(self) -> int:
        """Questions admitted and not yet resolved: the one count of questions on the model (`api.admission`
        reads it); called for every question, so cheap."""
        ...

    def loading(self) -> bool:
        """True while no worker can answer because its model is loading (the process engine replacing its set);
        called for every question, so cheap."""
        ...

    def stats(self) -> BatcherStats:
        """A snapshot of the engine's counters."""
        ...

    def describe(self) -> dict[str, Any]:
        """Describe the engine (its kind and settings; for the process engine, the model its workers built)."""
        ...

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new questions, finish those in flight until `timeout`, fail the rest, stop the workers."""
        ...


@dataclass(frozen=True)
class Prediction:
    """The corrector's answer to one question, and the size of the batch it came in."""

    answer: str
    batch_size: int


def batch_fn(corrector: Corrector) -> Callable[[list[NBest]], list[Prediction]]:
    """Wrap `corrector.predict_batch` into the engine's batch function: each answer carries its batch's size."""

    def predict(items: list[NBest]) -> list[Prediction]:
        answers = corrector.predict_batch(items)
        # The engine checks that one answer came back per item; keep the corrector's length as it is.
        return [Prediction(answer, len(items)) for answer in answers]

    return predict


def size_of(item: NBest) -> int:
    """Measure a question as the corrector pads it: the Han characters of TOP1 (`model.features`)."""
    return len(han_chars(item.top1))
