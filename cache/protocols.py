"""What the cache offers its callers (`ResultCache`) and what it reports to metrics (`CacheObserver`)."""

from __future__ import annotations

from typing import Protocol


class ResultCache(Protocol):
    """Where answers wait for the retry of their question."""

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question, or None."""
        ...

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer to this question, replacing any earlier one."""
        ...


class SharedStore(ResultCache, Protocol):
    """A level every worker or replica reads (SQLite, Redis): written from the write-behind thread, many at once."""

    def put_many(self, items: list[tuple[str, str]]) -> None:
        """Store each (esun_uuid, answer), replacing earlier ones, in as few round trips as the store allows."""
        ...


class CacheObserver(Protocol):
    """What the cache reports to metrics: each lookup's level and result, and the breaker's state."""

    def cache_lookup(self, level: str, result: str) -> None:
        """Count one lookup: level "local", or the shared level's "sqlite" or "redis"; result "hit", "miss", "error"
        or "skipped"."""
        ...

    def redis_circuit(self, is_open: bool) -> None:
        """Record whether the Redis circuit breaker is open (Redis skipped)."""
        ...
