"""Overload control: shed model work while requests queue before their view, so that answers stay in budget.

Why. Under overload the budget is spent before the view starts: a request waits for a gunicorn thread and for
the GIL while model batches hold both cores, and a TOP1 given at the view is already late. The batcher's own
bound (`MAX_IN_FLIGHT`) caps what waits on the model, but every admitted item still costs the CPU that the HTTP
path needs to drain the queue. Giving less work to the model while that queue stands gives the CPU back to the
request threads; when the queue is gone, the model gets its share back.

What it watches: each request's queued time (`queued_s`: from its accept stamp, `api.accept`, to its view's
start), folded as CoDel does: the *smallest* queued time seen in each interval (`interval_s`). A burst that
clears within an interval has a small minimum; only a standing queue, where even the luckiest request waited
longer than `target_s`, counts as overload. An interval with no request at all is not overload.

What it does, at the end of each interval (AIMD on the model's share, like TCP's congestion window):

- standing queue: the limit of model requests in flight is halved (from `max_in_flight` down to 0);
- otherwise: it grows by `max_in_flight / RECOVERY_STEPS` per interval until back at `max_in_flight`.

A request that finds as many model requests in flight as the limit allows is answered TOP1 at once (path
`shed`); so is every new arrival at limit 0. At limit `max_in_flight` the controller admits every request and
leaves the bound to the batcher (path `overload`), so a server without a standing queue never answers `shed`. The level (0 normal, 1 reduced, 2 all
shed), the limit, the signal and the shed count are in `/metrics` (`api.metrics`); every change of level is one
JSON log line (logger `api.overload`).

Cost on the request path: one lock and a few comparisons; no thread of its own (intervals close lazily, on the
next request, so an idle server's controller does nothing and recovers at the first request after the lull).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("api.overload")

# Levels of the controller, as exposed in /metrics and in its log lines.
NORMAL, REDUCED, SHEDDING = 0, 1, 2
LEVEL_NAMES = {NORMAL: "normal", REDUCED: "reduced", SHEDDING: "shedding"}
# Multiplicative decrease per overloaded interval: from 96 to 0 in 7 intervals.
DECREASE_FACTOR = 0.5
# Additive increase: from 0 back to max_in_flight in this many calm intervals.
RECOVERY_STEPS = 8


@dataclass(frozen=True)
class OverloadState:
    """A snapshot of the controller: what /metrics and the log show."""

    level: int
    limit: int
    in_flight: int
    shed_total: int
    # The signal: the smallest queued time of the last closed interval (0.0 when it had no request).
    queued_min_s: float
    enabled: bool

    @property
    def level_name(self) -> str:
        return LEVEL_NAMES[self.level]


class OverloadControl:
    """AIMD limit on model requests in flight, driven by the minimum queued time per interval.

    Thread safety: every method may be called from any request thread. `clock` is `time.monotonic` in service and
    a fake clock in tests; every decision depends only on it and on the calls made.
    """

    def __init__(self, max_in_flight: int, target_s: float, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if target_s < 0:
            raise ValueError(f"target_s must be >= 0 (0: off), got {target_s}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.max_in_flight = max_in_flight
        self.target_s = target_s
        self.interval_s = interval_s
        self.enabled = target_s > 0
        self._clock = clock
        self._lock = threading.Lock()
        self._limit = max_in_flight
        self._in_flight = 0
        self._shed_total = 0
        self._interval_end = clock() + interval_s
        self._interval_min: float | None = None  # smallest queued time in the open interval; None: no request
        self._last_min_s = 0.0
        self._step = max(1, math.ceil(max_in_flight / RECOVERY_STEPS))

    def observe(self, queued_s: float) -> None:
        """Fold one request's queued time (accept to view start) into the open interval, closing past ones."""
        if not self.enabled:
            return
        with self._lock:
            change = self._roll(self._clock())
            current = self._interval_min
            self._interval_min = queued_s if current is None else min(current, queued_s)
        if change is not None:
            _log_change(*change)

    def admit(self) -> bool:
        """Take a model slot if the limit allows (the caller must `release` it); False: answer TOP1 now."""
        if not self.enabled:
            return True
        with self._lock:
            change = self._roll(self._clock())
            # At the full limit the batcher's own bound (max_in_flight, path `overload`) is the only one.
            admitted = self._limit >= self.max_in_flight or self._in_flight < self._limit
            if admitted:
                self._in_flight += 1
            else:
                self._shed_total += 1
        if change is not None:
            _log_change(*change)
        return admitted

    def release(self) -> None:
        """Give back a slot taken by `admit` (the model answered, or the request stopped waiting)."""
        if not self.enabled:
            return
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)

    def state(self) -> OverloadState:
        """Return the controller's state now (closing intervals that ended)."""
        with self._lock:
            change = self._roll(self._clock())
            snapshot = self._snapshot()
        if change is not None:
            _log_change(*change)
        return snapshot

    def _snapshot(self) -> OverloadState:
        return OverloadState(_level(self._limit, self.max_in_flight), self._limit, self._in_flight,
                             self._shed_total, self._last_min_s, self.enabled)

    def _roll(self, now: float) -> tuple[OverloadState, OverloadState] | None:
        """Close every interval that ended by `now` (caller holds the lock); return (before, after) on a level
        change, for the caller to log outside the lock."""
        if now < self._interval_end:
            return None
        before = self._snapshot()
        # The interval that just closed; the ones after it, if the server was idle, had no request.
        self._apply(self._interval_min)
        idle = int((now - self._interval_end) // self.interval_s)
        for _ in range(min(idle, RECOVERY_STEPS)):
            self._apply(None)
        self._interval_end += (idle + 1) * self.interval_s
        self._interval_min = None
        after = self._snapshot()
        return (before, after) if after.level != before.level else None

    def _apply(self, queued_min_s: float | None) -> None:
        """AIMD step for one closed interval."""
        self._last_min_s = 0.0 if queued_min_s is None else queued_min_s
        if queued_min_s is not None and queued_min_s > self.target_s:
            self._limit = int(self._limit * DECREASE_FACTOR)
        else:
            self._limit = min(self.max_in_flight, self._limit + self._step)


def _level(limit: int, max_in_flight: int) -> int:
    if limit >= max_in_flight:
        return NORMAL
    return SHEDDING if limit == 0 else REDUCED


def _log_change(before: OverloadState, after: OverloadState) -> None:
    """One JSON line per change of level (api.logs' formatter)."""
    log = logger.warning if after.level > before.level else logger.info
    log("overload level changed", extra={"fields": {
        "overload_level": after.level_name, "overload_level_before": before.level_name,
        "model_limit": after.limit, "queued_min_ms": round(after.queued_min_s * 1000, 1),
        "model_in_flight": after.in_flight, "shed_total": after.shed_total}})
