"""Answers already computed, keyed by esun_uuid, so that a retry is answered at once.

`ResultCache` is the interface the views use (get/put). `MemoryResultCache` is the in-process version: an
LRU with a time-to-live, safe across the request threads and the batcher's worker (which stores answers that
came back after their request gave up). A Redis-backed cache, for several processes, would implement the
same two methods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from cachetools import TTLCache

from config import Config, ConfigError


class ResultCache(Protocol):
    """Where answers wait for the retry of their question."""

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question, or None."""
        ...

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer to this question, replacing any earlier one."""
        ...


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


def build_cache(config: Config) -> ResultCache:
    """Build the result cache the config asks for."""
    if config.redis_url:
        # Kept as a setting so deployments can name it; fail loudly rather than silently ignore it.
        raise ConfigError("redis_url must be empty: only the in-process cache exists so far, got a URL")
    return MemoryResultCache(max_entries=config.cache_size, ttl_s=config.cache_ttl_s)
