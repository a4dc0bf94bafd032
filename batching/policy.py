"""The adaptive dispatch policy as pure functions and small estimators, testable without threads.

The threaded engine's worker asks ``adaptive_wait_s`` (or ``fixed_wait_s``) how long to hold the next batch open,
and ``similar_sizes`` which items to take when more than a batch waits. ``RunTimes`` and ``Traffic`` hold what it
has measured: batch run times by size, the arrival gap and the load average. Nothing here starts a thread, and
every time is passed in (only a new ``Traffic`` reads the clock, once, as the start of its load average).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import accumulate

__all__ = [
    "RunTimes",
    "Traffic",
    "Window",
    "adaptive_wait_s",
    "fixed_wait_s",
    "padded_waste",
    "similar_sizes",
]

# Weight of the newest sample in the run-time and arrival-gap averages.
EWMA_ALPHA = 0.3
# An idle spell longer than this says nothing more about traffic; capping it lets the gap estimate recover.
GAP_CAP_S = 1.0
# Time constants of the load average (mean number of items in the batcher, waiting or running): it follows a
# rise within a fraction of a second and a fall over about a second, so heavy load switches the throughput mode
# on at once and a short lull does not switch it off. A wrong switch costs little: the hold ends when arrivals
# pause (PATIENCE_GAPS) and never passes a deadline.
LOAD_RISE_TAU_S = 0.2
LOAD_FALL_TAU_S = 1.0
# Above this share of max_batch_size in the load average, full batches are within reach: hold for them.
FULL_LOAD_SHARE = 0.5
# In throughput mode, how many expected arrival gaps of silence end the wait (the stream has paused).
PATIENCE_GAPS = 10.0
# ... and at least this share of the batch's run time: the wait costs latency, not throughput, and a pause of a
# few gaps is often only the scheduler (two cores shared with the request threads), not the stream's end.
PATIENCE_RUN_SHARE = 0.25
# The fewest waiting items whose arrival times tell a rate.
RATE_MIN_ITEMS = 3
# The peak number of items in the batcher is taken over the last one to two windows of this length.
PEAK_WINDOW_S = 1.0


class RunTimes:
    """EWMA of batch run time per power-of-two size bucket, from successful batches; worker thread only."""

    def __init__(self) -> None:
        self._by_bucket: dict[int, float] = {}

    def observe(self, size: int, seconds: float) -> None:
        """Fold one measured batch into its bucket's average."""
        bucket = _bucket(size)
        old = self._by_bucket.get(bucket)
        self._by_bucket[bucket] = seconds if old is None else old + EWMA_ALPHA * (seconds - old)

    def estimate(self, size: int) -> float:
        """Return the expected run time of a batch of this size; 0.0 before any batch was measured."""
        if not self._by_bucket:
            return 0.0
        bucket = _bucket(size)
        # Nearest measured bucket, the larger on a tie: overestimating only makes the window shorter.
        nearest = min(self._by_bucket, key=lambda known: (abs(known - bucket), -known))
        return self._by_bucket[nearest]


class Traffic:
    """What submits say about the load: the arrival gap (EWMA) and the load average (items in the batcher).

    Writers (note_arrival, note_count) are serialised by the batcher lock; the worker reads without it, so the
    load state is one tuple replaced whole.
    """

    def __init__(self) -> None:
        self.gap_s: float | None = None
        self._last: float | None = None
        self._load: tuple[float, int, float] = (time.monotonic(), 0, 0.0)  # (since, count since then, average)
        # (peak of the previous window, peak of the current window, current window's index, count now)
        self._peaks: tuple[int, int, int, int] = (0, 0, 0, 0)

    def note_arrival(self, now: float) -> None:
        """Record one arrival."""
        if self._last is not None:
            sample = min(now - self._last, GAP_CAP_S)
            self.gap_s = sample if self.gap_s is None else self.gap_s + EWMA_ALPHA * (sample - self.gap_s)
        self._last = now

    def note_count(self, now: float, count: int) -> None:
        """Record that the number of items in the batcher changed to count at now."""
        self._load = (now, count, self.load(now))
        previous, current, window, held = self._peaks
        index = int(now / PEAK_WINDOW_S)
        if index != window:
            # The count held across the boundary belongs to the new window (and to a skipped one).
            previous, current, window = (current if index == window + 1 else held), held, index
        self._peaks = (previous, max(current, count), window, count)

    def peak(self, now: float) -> int:
        """Return the most items in the batcher at once over the last one to two PEAK_WINDOW_S."""
        previous, current, window, held = self._peaks
        index = int(now / PEAK_WINDOW_S)
        if index == window:
            return max(previous, current)
        return max(current, held) if index == window + 1 else held

    def load(self, now: float) -> float:
        """Return the recent time-average number of items in the batcher (see LOAD_RISE_TAU_S)."""
        since, count, average = self._load
        tau = LOAD_RISE_TAU_S if count > average else LOAD_FALL_TAU_S
        return average + (1.0 - math.exp(-max(0.0, now - since) / tau)) * (count - average)


def _bucket(size: int) -> int:
    """Map a batch size to its bucket: 1, 2, 3-4, 5-8, ..."""
    return (max(size, 1) - 1).bit_length()



def similar_sizes(sizes: list[int], k: int) -> list[int]:
    """Return, in arrival order, the indices of k items of similar size that include item 0 (the oldest)."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    ordered = [sizes[i] for i in order]
    prefix = [0, *accumulate(ordered)]
    oldest = order.index(0)
    starts = range(max(0, oldest - k + 1), min(oldest, len(sizes) - k) + 1)
    # In sorted order a contiguous run padded to its last (longest) item wastes k * longest - total.
    best = min(starts, key=lambda s: k * ordered[s + k - 1] - (prefix[s + k] - prefix[s]))
    return sorted(order[best : best + k])


def padded_waste(sizes: list[int]) -> int:
    """Return the padding a batch of these sizes costs: max_len * n - sum(len)."""
    return max(sizes) * len(sizes) - sum(sizes) if sizes else 0


def fixed_wait_s(waiting: int, opened_at: float, now: float, max_batch_size: int, max_wait_s: float) -> float:
    """Return how long service-streamer's window would still wait, bounded by max_wait_s after it opened."""
    if waiting >= max_batch_size:
        return 0.0
    return max(0.0, opened_at + max_wait_s - now)


@dataclass(frozen=True)
class Window:
    """What the adaptive rule looks at when the batch function is free and items wait."""

    now: float
    waiting: int
    opened_at: float
    arrived_idle: bool
    earliest_deadline: float
    gap_s: float | None
    run_s_next: float
    load: float = 0.0
    peak: int = 0
    span_s: float = 0.0  # since the oldest waiting item arrived


def adaptive_wait_s(window: Window, max_batch_size: int, max_wait_s: float) -> float:
    """Return how long to hold the next batch open for one more request; 0.0 means dispatch now.

    Two regimes, told apart by the load average (mean number of items in the batcher). Under light load latency
    wins: an item that finds the batch function idle runs at once, and a busy stream waits one arrival gap only
    while that costs the waiting items less than the newcomer would lose by missing the batch. Under heavy load
    (at least FULL_LOAD_SHARE of a batch in the batcher on average) throughput wins where a full batch is within
    reach: the window holds, even for an item that found the function idle (under heavy load, the first of a
    burst), until the batch is full or holds as many items as were recently in the batcher at once (its peak:
    with fewer clients than a batch, no one else is coming), until the stream pauses (PATIENCE_GAPS gaps, at
    least PATIENCE_RUN_SHARE of a run), or until the window must close. Full batches cost the least per item,
    and where the batch function shares the CPU with the request threads (a CPU server), a small batch run during
    an arrival burst slows both. But when the items that came during the last run arrived at a steady rate too
    slow to fill the batch in the window (open-loop load), the latency rules apply: holding would only add the
    window to every answer.
    """
    if window.waiting >= max_batch_size or window.gap_s is None:
        return 0.0
    closes_at = min(window.opened_at + max_wait_s, window.earliest_deadline - window.run_s_next)
    if window.now + window.gap_s > closes_at:
        return 0.0  # no request is expected before the window must close, so waiting cannot fill the batch
    if window.load >= FULL_LOAD_SHARE * max_batch_size:
        target = min(max_batch_size, window.peak)
        if window.waiting >= target:
            return 0.0  # every item recently in the batcher is here: waiting cannot fill the batch
        left_s = closes_at - window.now
        # Items that came while a batch ran arrived at the stream's steady rate: hold only if that rate fills the
        # batch before the window closes. An item that found the function idle under heavy load is most often the
        # first of a burst (clients whose answers just went out), whose rate is not known yet: hold.
        steady = not window.arrived_idle and window.waiting >= RATE_MIN_ITEMS
        rate = (window.waiting - 1) / max(window.span_s, 1e-9)
        if not steady or window.waiting + rate * left_s >= target:
            return min(max(PATIENCE_GAPS * window.gap_s, PATIENCE_RUN_SHARE * window.run_s_next), left_s)
    if window.arrived_idle:
        return 0.0
    # Waiting one gap delays each of the n waiting items by a gap; it spares the newcomer a whole run.
    if (window.waiting + 1) * window.gap_s >= window.run_s_next:
        return 0.0
    return window.gap_s

