"""The in-process level: an LRU of answers with a time-to-live (cachetools), behind a lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cachetools import TTLCache


class MemoryResultCache:
    """An in-process LRU of answers that forgets them after `ttl_s` seconds; thread-safe."""

    def __init__(self, max_entries: int, ttl_s: float, timer: Callable[[], float] = time.monotonic) -> None:
        self._entries: TTLCache[str, str] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=timer)
        # TTLCache is not thread-safe, and even a get reorders the LRU list.
        self._lock = threading.Lock()

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question, or None."""
        with self._lock:
            return self._entries.get(esun_uuid)

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer to this question, replacing any earlier one."""
        with self._lock:
            self._entries[esun_uuid] = answer

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
