"""A circuit breaker for the Redis level: stop calling a Redis that keeps failing, try again after a cooldown.

Written here rather than taken from PyPI's `pybreaker` (1.4.1, the kept library for this), because pybreaker
does not fit this use on three counts:
- `CircuitBreaker.call` holds the breaker's one lock for the whole guarded call, so every Redis GET of the 128
  gunicorn threads would wait in line behind the others (a known limitation: pybreaker issue #3; the pull
  requests that removed the lock, #41, #57 and #77, were closed unmerged);
- while half-open it lets the callers that wait on that lock through one after the other, where this breaker
  refuses them at once (one trial at a time: a request must never wait for Redis's socket timeout twice);
- it reads the wall clock (`datetime.now`) with no way to inject one, so cooldowns could only be tested by
  sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("api.cache")

BREAKER_FAILURES = 3
BREAKER_COOLDOWN_S = 5.0


class CircuitBreaker:
    """Stop calling a service after `failures` failures in a row; let one call try again after `cooldown_s`.

    Closed: every call goes through. Open: calls are refused until the cooldown ends. Then one caller at a
    time is let through (half-open); its success closes the breaker, its failure opens it for another
    cooldown. Thread-safe. `on_change(is_open)` is called on every transition, outside the lock.
    """

    def __init__(self, failures: int = BREAKER_FAILURES, cooldown_s: float = BREAKER_COOLDOWN_S,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        if cooldown_s <= 0:
            raise ValueError(f"cooldown_s must be > 0, got {cooldown_s}")
        self._threshold = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until: float | None = None
        self._trial_running = False

    @property
    def cooldown_s(self) -> float:
        return self._cooldown_s

    @property
    def is_open(self) -> bool:
        """Tell whether calls are being refused (or only a trial call is let through)."""
        with self._lock:
            return self._open_until is not None

    def allow(self) -> bool:
        """Tell whether the caller may call the service now; a True while open makes it the trial call."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._trial_running or self._clock() < self._open_until:
                return False
            self._trial_running = True
            return True

    def succeeded(self) -> None:
        """Record a successful call: the breaker closes."""
        with self._lock:
            was_open = self._open_until is not None
            self._failures = 0
            self._open_until = None
            self._trial_running = False
        if was_open:
            self._notify(False)

    def failed(self) -> bool:
        """Record a failed call; return True when this failure opened the breaker."""
        with self._lock:
            self._failures += 1
            was_open = self._open_until is not None
            if not (self._trial_running or self._failures >= self._threshold):
                return False
            self._open_until = self._clock() + self._cooldown_s
            self._trial_running = False
        if not was_open:
            self._notify(True)
        return not was_open

    def _notify(self, is_open: bool) -> None:
        if self._on_change is not None:
            try:
                self._on_change(is_open)
            except Exception:
                log.exception("circuit breaker observer failed")
