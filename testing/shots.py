"""What one load run records: a `Shot` per request and the `LoadRun` a driver brings back (`testing.load` makes
them; `testing.report` and the tools add them up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shot:
    """One request: when it was due (wall clock; latency counts from it, lag included), how long it took, its status
    (0: no answer), its problem (None: valid), the generator's lag, its esun_uuid, (`report.tag_paths`) its path,
    which body it sent (`question`: its index in the run's templates) and (`answers=True`) the answer."""

    due: float
    latency_s: float
    status: int
    problem: str | None
    lag_s: float = 0.0
    esun_uuid: str = ""
    path: str | None = None
    question: int = -1
    answer: str | None = None

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def done(self) -> float:
        return self.due + self.latency_s


@dataclass
class LoadRun:
    """What a driver brings back: the shots due in its measured window (wall clock, the warm-up left out) and the
    generator's own figures (its name, its CPU as a share of one core, its connections)."""

    shots: list[Shot]
    start: float
    end: float
    generator: dict[str, Any]
