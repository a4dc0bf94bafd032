"""The in-process level: an LRU of answers with a time-to-live, behind a lock."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class MemoryResultCache:
    """An in-process LRU of answers that forgets them after `ttl_s` seconds; thread-safe.

    Each entry is a tuple (answer, expiry) in an OrderedDict kept in least-recently-used order: tuples of a string and a
    number are untracked by Python's cyclic GC, where cachetools' TTLCache (used before) kept one tracked link object
    per entry, up to 100,000 of them, all scanned by every full collection of a served process, while it held the GIL
    (docs/benchmarks.md, "GC pauses"). An expired answer is forgotten when asked for, or when the least recently used
    entries make room.
    """

    def __init__(self, max_entries: int, ttl_s: float, timer: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._timer = timer
        self._lock = threading.Lock()  # an OrderedDict is not safe to reorder from several threads at once

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question, or None."""
        with self._lock:
            entry = self._entries.get(esun_uuid)
            if entry is None:
                return None
            if self._timer() >= entry[1]:
                del self._entries[esun_uuid]
                return None
            self._entries.move_to_end(esun_uuid)
            return entry[0]

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer to this question, replacing any earlier one."""
        with self._lock:
            self._entries[esun_uuid] = (answer, self._timer() + self._ttl_s)
            self._entries.move_to_end(esun_uuid)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
