"""Admission: whether a question may go to the model. One object; the count of questions on the model is the
engine's own (`Engine.in_flight`: admitted and not yet resolved), read, never kept a second time.

Both doors ask it (`api.answers`): the worker's event loop before handing a request to a thread (`at_door=True`), and
the view before submitting the question to the batcher. A question it keeps from the model is answered TOP1 at once,
with the path of the check that kept it, asked in this order (as Triton's queue policy, one table):

| check | refuses when | path | setting |
|---|---|---|---|
| thread pool (event loop only) | `pool_cap` requests are in the thread pool | `pool_full` | `MAX_BATCH_SIZE` (twice) |
| late accept | less than `min_model_budget_s` of the budget is left | `late_accept` | `MIN_MODEL_BUDGET_S` |
| overload control | its reduced share (below) of the model is taken | `shed` | `OVERLOAD_TARGET_S` (0: off) |

Past them, the engine's own bound refuses (`batching.Overloaded`, path `overload`): it admits at most `pool_cap`
questions, the most the pool can hold, since each question waits on a pool thread; only a question whose request
stopped waiting (its deadline) and that no batch has started yet can make it full.

Why each: a request in the pool is a thread contending for the GIL with the event loop that reads every request;
one that waited for a thread so long that less than a batch's run time is left would answer late.

The overload control sheds model work while requests queue, so that answers stay in budget. Under overload the
budget is spent waiting: before the view (for a thread, for the GIL while batches hold both cores), where a TOP1
given at the view is already late, and on the model (batches slower than the budget, starved of CPU by the
request threads). It watches, folded as CoDel does, the *smallest* value seen in each interval (`INTERVAL_S`):

- queued time: each request's time from its accept stamp (`api.accept`) to its view (`observe_queued`);
- model wait: each submitted question's time from its submit to its answer, model or deadline
  (`observe_model_wait`): the measured batch times, as the questions saw them. Its target is `MODEL_SHARE` of the
  budget.

A burst that clears within an interval has a small minimum; only a queue where even the luckiest request waited
longer than its target counts, and only when it stands for two intervals in a row (a single stall of the
process, a batch holding the GIL, makes every request of the next interval wait with no queue at all). At the end
of each interval (AIMD on the model's share, as TCP's congestion window): a standing queue halves the limit (from
`pool_cap` down to 0); one interval over target after a calm one keeps it; otherwise it grows by
`pool_cap / RECOVERY_STEPS` per interval back to `pool_cap`. The level (0 normal, 1 reduced, 2 all shed),
the limit, the counts and the signals are in `/metrics` (`api.metrics`); every change of level is one JSON log
line (logger `api.admission`). Cost on the request path: one lock and a few comparisons; no thread of its own
(intervals close lazily, on the next call).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from api.paths import AnswerPath
from config import Config

logger = logging.getLogger("api.admission")

# Levels of the controller, as exposed in /metrics and in its log lines.
NORMAL, REDUCED, SHEDDING = 0, 1, 2
LEVEL_NAMES = {NORMAL: "normal", REDUCED: "reduced", SHEDDING: "shedding"}
# Multiplicative decrease per interval of a standing queue: from 64 to 0 in 7 intervals.
DECREASE_FACTOR = 0.5
# Additive increase: from 0 back to pool_cap in this many calm intervals.
RECOVERY_STEPS = 8
# The overload control's interval, and its target for the least model wait: this share of the budget.
INTERVAL_S = 0.1
MODEL_SHARE = 0.5


@dataclass(frozen=True)
class AdmissionState:
    """A snapshot of the admission: what /metrics and the log show."""

    level: int
    limit: int
    on_model: int
    in_pool: int
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


class Admission:
    """Decides whether a question may go to the model (module docstring: the checks, in order).

    `on_model` counts the questions on the model: the engine's `in_flight` in service (`create_app` builds the
    admission with it), a fake count in tests. Thread safety: every method may be called from any thread (the event
    loop, request threads). `clock` is `time.monotonic` in service and a fake clock in tests; every decision depends
    only on it, on `on_model` and on the calls made.
    """

    def __init__(self, pool_cap: int, min_model_budget_s: float, target_s: float, model_target_s: float,
                 interval_s: float = INTERVAL_S, *, on_model: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if pool_cap < 1:
            raise ValueError(f"pool_cap must be >= 1, got {pool_cap}")
        if target_s < 0:
            raise ValueError(f"target_s must be >= 0 (0: off), got {target_s}")
        if interval_s <= 0 or model_target_s <= 0:
            raise ValueError(f"interval_s and model_target_s must be > 0, got {interval_s}, {model_target_s}")
        self.pool_cap = pool_cap
        self._on_model = on_model
        self.min_model_budget_s = min_model_budget_s
        self.interval_s = interval_s
        self.enabled = target_s > 0
        self._clock = clock
        self._lock = threading.Lock()
        self._limit = pool_cap
        self._in_pool = 0
        self._interval_end = clock() + interval_s
        self._queued = _Minimum(target_s)
        self._model_wait = _Minimum(model_target_s)
        self._step = max(1, math.ceil(pool_cap / RECOVERY_STEPS))

    @classmethod
    def from_config(cls, config: Config, on_model: Callable[[], int],
                    clock: Callable[[], float] = time.monotonic) -> Admission:
        """Build the admission `config` sets, counting the questions on the model with `on_model`."""
        return cls(config.pool_cap, config.min_model_budget_s, config.overload_target_s,
                   MODEL_SHARE * config.budget_s, on_model=on_model, clock=clock)

    # --- the thread pool (counted by the worker's event loop and its threads) ---------------------------------

    def enter_pool(self) -> None:
        """Count a request handed to the thread pool."""
        with self._lock:
            self._in_pool += 1

    def leave_pool(self) -> None:
        """Count a request of the thread pool out, once its answer is made."""
        with self._lock:
            self._in_pool -= 1

    # --- the checks -------------------------------------------------------------------------------------------

    def refusal(self, deadline: float, now: float, at_door: bool = False) -> AnswerPath | None:
        """Say which check keeps a question arriving now from the model (None: none).

        `at_door`: asked by the event loop for a request not yet in the pool, where a full pool refuses too.
        """
        with self._lock:
            change = self._roll(self._clock())
            path = self._check(deadline, now, at_door)
        _log_change(change)
        return path

    def observe_model_wait(self, waited_s: float) -> None:
        """Fold how long a submitted question waited on the model (its answer or its deadline) into the interval."""
        if not self.enabled:
            return
        with self._lock:
            change = self._roll(self._clock())
            self._model_wait.add(waited_s)
        _log_change(change)

    def observe_queued(self, queued_s: float) -> None:
        """Fold one request's queued time (accept stamp to view) into the open interval."""
        if not self.enabled:
            return
        with self._lock:
            change = self._roll(self._clock())
            self._queued.add(queued_s)
        _log_change(change)

    def state(self) -> AdmissionState:
        """Return the state now (closing intervals that ended)."""
        with self._lock:
            change = self._roll(self._clock())
            snapshot = self._snapshot()
        _log_change(change)
        return snapshot

    def _check(self, deadline: float, now: float, at_door: bool) -> AnswerPath | None:
        if at_door and self._in_pool >= self.pool_cap:
            return AnswerPath.POOL_FULL
        if deadline - now < self.min_model_budget_s:
            return AnswerPath.LATE_ACCEPT
        if self._limit < self.pool_cap and self._on_model() >= self._limit:  # reduced (never when off)
            return AnswerPath.SHED
        return None

    def _snapshot(self) -> AdmissionState:
        return AdmissionState(_level(self._limit, self.pool_cap), self._limit, self._on_model(), self._in_pool,
                              self._queued.last_s, self._model_wait.last_s, self.enabled)

    def _roll(self, now: float) -> tuple[AdmissionState, AdmissionState] | None:
        """Close every interval that ended by `now` (caller holds the lock); return (before, after) on a level
        change, for the caller to log outside the lock."""
        if not self.enabled or now < self._interval_end:
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
            self._limit = min(self.pool_cap, self._limit + self._step)


def _level(limit: int, pool_cap: int) -> int:
    if limit >= pool_cap:
        return NORMAL
    return SHEDDING if limit == 0 else REDUCED


def _log_change(change: tuple[AdmissionState, AdmissionState] | None) -> None:
    """One JSON line per change of level (api.logs' formatter)."""
    if change is None:
        return
    before, after = change
    log = logger.warning if after.level > before.level else logger.info
    log("overload level changed", extra={"fields": {
        "overload_level": after.level_name, "overload_level_before": before.level_name,
        "model_limit": after.limit, "queued_min_ms": round(after.queued_min_s * 1000, 1),
        "model_wait_min_ms": round(after.model_wait_min_s * 1000, 1),
        "model_in_flight": after.on_model}})
