"""Overload control: shed model work while requests queue, so that answers stay in budget.

Why. Under overload the budget is spent waiting: before the view (for a gunicorn thread, for the GIL while model
batches hold both cores), where a TOP1 given at the view is already late, and on the model (batches that run
slower than the budget, starved of CPU by the request threads), where a request holds its thread for the whole
budget and then answers TOP1 anyway (path `deadline`). The batcher's own bound (`MAX_IN_FLIGHT`) caps what waits
on the model, but every admitted item still costs CPU the HTTP path needs. Giving less work to the model while
requests queue gives the CPU back to the request threads, and smaller batches that finish in time; when the
queues are gone, the model gets its share back.

What it watches, folded as CoDel does, by the *smallest* value seen in each interval (`interval_s`):

- queued time: each request's time from its accept stamp (`api.accept`) to its view's start (`observe`);
- model wait: each admitted request's time from admission to its answer, model or deadline (`release`).

A burst that clears within an interval has a small minimum; only a standing queue, where even the luckiest
request waited longer than its target (`target_s` before the view, `model_target_s` on the model), counts, and
only when it stands for two intervals in a row. (One interval is not enough: a single stall of the process, e.g.
a batch holding the GIL, makes every request of the next interval wait, with 64 closed-loop clients and no queue
at all; a queue that stands for two intervals is arriving faster than it is served.) An interval with no request
is calm.

What it does, at the end of each interval (AIMD on the model's share, like TCP's congestion window):

- standing queue (this interval and the one before over a target): the limit of model requests in flight is
  halved (from `max_in_flight` down to 0);
- one interval over a target after a calm one: the limit stays;
- otherwise: it grows by `max_in_flight / RECOVERY_STEPS` per interval until back at `max_in_flight`.

A request that finds as many model requests in flight as the limit allows is answered TOP1 at once (path
`shed`); so is every new arrival at limit 0. Most of them never reach a thread: the worker's event loop asks
first (`turn_away`, api.door) and answers them itself. At limit `max_in_flight` the controller admits every request and
leaves the bound to the batcher (path `overload`), so a server without a standing queue never answers `shed`.
The level (0 normal, 1 reduced, 2 all shed), the limit, the signals and the shed count are in `/metrics`
(`api.metrics`); every change of level is one JSON log line (logger `api.overload`).

Cost on the request path: one lock and a few comparisons; no thread of its own (intervals close lazily, on the
next call, so an idle server's controller does nothing and recovers at the first request after the lull).
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
# Multiplicative decrease per interval of a standing queue: from 96 to 0 in 7 intervals.
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
    # The signals: the smallest queued time and model wait of the last closed interval (0.0: no sample).
    queued_min_s: float
    model_wait_min_s: float
    enabled: bool

    @property
    def level_name(self) -> str:
        return LEVEL_NAMES[self.level]


class _Minimum:
    """The smallest sample of the open interval, and whether the last two closed ones were over target."""

    def __init__(self, target_s: float) -> None:
        self.target_s = target_s
        self.current: float | None = None
        self.last_s = 0.0
        self.over = False

    def add(self, value: float) -> None:
        self.current = value if self.current is None or value < self.current else self.current

    def close(self) -> tuple[bool, bool]:
        """End the interval; return (over target now, over target in the interval before too)."""
        over_before = self.over
        self.last_s = 0.0 if self.current is None else self.current
        self.over = self.current is not None and self.current > self.target_s
        self.current = None
        return self.over, over_before


class OverloadControl:
    """AIMD limit on model requests in flight, driven by the least queued time and model wait per interval.

    Thread safety: every method may be called from any request thread. `clock` is `time.monotonic` in service and
    a fake clock in tests; every decision depends only on it and on the calls made.
    """

    def __init__(self, max_in_flight: int, target_s: float, interval_s: float, model_target_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if target_s < 0:
            raise ValueError(f"target_s must be >= 0 (0: off), got {target_s}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if model_target_s <= 0:
            raise ValueError(f"model_target_s must be > 0, got {model_target_s}")
        self.max_in_flight = max_in_flight
        self.interval_s = interval_s
        self.enabled = target_s > 0
        self._clock = clock
        self._lock = threading.Lock()
        self._limit = max_in_flight
        self._in_flight = 0
        self._shed_total = 0
        self._interval_end = clock() + interval_s
        self._queued = _Minimum(target_s)
        self._model_wait = _Minimum(model_target_s)
        self._step = max(1, math.ceil(max_in_flight / RECOVERY_STEPS))

    def observe(self, queued_s: float) -> None:
        """Fold one request's queued time (accept to view start) into the open interval, closing past ones."""
        if not self.enabled:
            return
        with self._lock:
            change = self._roll(self._clock())
            self._queued.add(queued_s)
        _log_change(change)

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
        _log_change(change)
        return admitted

    def turn_away(self) -> str | None:
        """Say whether a request arriving now would get no model slot, without taking one: "shed" when the
        limit is reduced and reached (counted as shed), "overload" when `max_in_flight` requests wait on the model
        already (the batcher would refuse it), else None.

        For the door (api.door), which answers such a request from the worker's event loop before any thread.
        """
        if not self.enabled:
            return None
        with self._lock:
            change = self._roll(self._clock())
            path = None
            if self._in_flight >= self._limit:
                path = "overload" if self._limit >= self.max_in_flight else "shed"
            if path == "shed":
                self._shed_total += 1
        _log_change(change)
        return path

    def release(self, waited_s: float) -> None:
        """Give back a slot taken by `admit`, with how long its request waited on the model (answer or deadline)."""
        if not self.enabled:
            return
        with self._lock:
            change = self._roll(self._clock())
            self._in_flight = max(0, self._in_flight - 1)
            self._model_wait.add(waited_s)
        _log_change(change)

    def state(self) -> OverloadState:
        """Return the controller's state now (closing intervals that ended)."""
        with self._lock:
            change = self._roll(self._clock())
            snapshot = self._snapshot()
        _log_change(change)
        return snapshot

    def _snapshot(self) -> OverloadState:
        return OverloadState(_level(self._limit, self.max_in_flight), self._limit, self._in_flight,
                             self._shed_total, self._queued.last_s, self._model_wait.last_s, self.enabled)

    def _roll(self, now: float) -> tuple[OverloadState, OverloadState] | None:
        """Close every interval that ended by `now` (caller holds the lock); return (before, after) on a level
        change, for the caller to log outside the lock."""
        if now < self._interval_end:
            return None
        before = self._snapshot()
        self._step_limit()  # the interval that just closed
        # The ones after it, if nobody called meanwhile, had no sample: calm.
        idle = int((now - self._interval_end) // self.interval_s)
        for _ in range(min(idle, RECOVERY_STEPS + 1)):
            self._step_limit()
        self._interval_end += (idle + 1) * self.interval_s
        after = self._snapshot()
        return (before, after) if after.level != before.level else None

    def _step_limit(self) -> None:
        """AIMD step for one closed interval."""
        queued_over, queued_standing = self._queued.close()
        wait_over, wait_standing = self._model_wait.close()
        if (queued_over and queued_standing) or (wait_over and wait_standing):
            self._limit = int(self._limit * DECREASE_FACTOR)
        elif not (queued_over or wait_over):
            self._limit = min(self.max_in_flight, self._limit + self._step)


def _level(limit: int, max_in_flight: int) -> int:
    if limit >= max_in_flight:
        return NORMAL
    return SHEDDING if limit == 0 else REDUCED


def _log_change(change: tuple[OverloadState, OverloadState] | None) -> None:
    """One JSON line per change of level (api.logs' formatter)."""
    if change is None:
        return
    before, after = change
    log = logger.warning if after.level > before.level else logger.info
    log("overload level changed", extra={"fields": {
        "overload_level": after.level_name, "overload_level_before": before.level_name,
        "model_limit": after.limit, "queued_min_ms": round(after.queued_min_s * 1000, 1),
        "model_wait_min_ms": round(after.model_wait_min_s * 1000, 1),
        "model_in_flight": after.in_flight, "shed_total": after.shed_total}})
