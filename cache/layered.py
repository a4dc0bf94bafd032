"""The cache the app serves with: the local level first, then (if any) the shared one, Redis or SQLite; and how it is
built."""

from __future__ import annotations

import logging
from pathlib import Path

from cache.breaker import BREAKER_COOLDOWN_S, BREAKER_FAILURES
from cache.memory import MemoryResultCache
from cache.protocols import CacheObserver, SharedStore
from cache.redis_cache import REDIS_KEY_PREFIX, REDIS_TIMEOUT_S, RedisResultCache
from cache.sqlite_cache import SQLITE_FILE, SqliteResultCache
from cache.write_behind import WRITE_DRAIN_S, WRITE_QUEUE_SIZE, WriteBehind
from config import Config

log = logging.getLogger("api.cache")


class LayeredResultCache:
    """The local cache, then (if any) the shared one, each read on its own (`get_local`, `get_shared`: the event
    loop reads the local level only); answers found in the shared one are kept locally.

    `put` stores the answer locally at once, and hands the shared write to a `WriteBehind`: it never waits for
    Redis. `put` runs on the batcher's worker thread (api.answers stores answers from a done-callback), where
    one synchronous write per answer to a slow Redis would hold up the whole batch and the next. The request's own
    thread waits for its answer's write (`wait_shared`, bounded) before the response leaves, so that a retry sent
    the moment it arrives finds it in any worker; a replica that stops drains its queue at exit (`close`), one that
    is killed loses the writes still queued.
    A put of the answer the local cache already holds is not written again: api.answers stores each answer
    twice (from the request's thread and from the callback), and a slow Redis should take it once.
    """

    def __init__(self, local: MemoryResultCache, shared: SharedStore | None = None,
                 observer: CacheObserver | None = None, max_pending_writes: int = WRITE_QUEUE_SIZE) -> None:
        self.local = local
        self.shared = shared
        self._observer = observer
        self.writer = WriteBehind(shared.put_many, max_pending_writes) if shared is not None else None

    def get_local(self, esun_uuid: str) -> str | None:
        """Return the answer from the local cache alone (no network call), else None."""
        answer = self.local.get(esun_uuid)
        self._count("hit" if answer is not None else "miss")
        return answer

    def get_shared(self, esun_uuid: str) -> str | None:
        """Return the answer from the shared cache (kept locally once found), else None; None without one."""
        if self.shared is None:
            return None
        answer = self.shared.get(esun_uuid)
        if answer is not None:
            self.local.put(esun_uuid, answer)
        return answer

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer locally, and queue it for the shared cache unless it is stored already.

        Queued before it is stored locally: a thread that then finds it there (and so does not queue it again) finds
        its write queued as well, and `wait_shared` waits for it. Stored first, a request's thread could see the
        batcher callback's answer locally before that write was queued, and answer before it landed."""
        known = self.local.get(esun_uuid)
        if self.writer is not None and known != answer:
            self.writer.submit(esun_uuid, answer)
        self.local.put(esun_uuid, answer)

    def wait_shared(self, esun_uuid: str, timeout: float) -> bool:
        """Wait until the answer `put` queued for the shared level under `esun_uuid` is written there, at most
        `timeout` seconds (True at once without a shared level, or with nothing queued for it): a retry that reaches
        another worker or replica right after this answer leaves finds it there."""
        return self.writer.settled(esun_uuid, timeout) if self.writer is not None else True

    def flush(self, timeout: float = WRITE_DRAIN_S) -> bool:
        """Wait until the queued shared writes have landed; False when `timeout` seconds passed first."""
        return self.writer.flush(timeout) if self.writer is not None else True

    def close(self, timeout: float = WRITE_DRAIN_S) -> None:
        """Write what is queued for the shared cache (up to `timeout`), then stop the writer thread."""
        if self.writer is not None:
            self.writer.close(timeout)

    def _count(self, result: str) -> None:
        if self._observer is not None:
            self._observer.cache_lookup("local", result)


def build_cache(config: Config, observer: CacheObserver | None = None) -> LayeredResultCache:
    """Build the result cache the config asks for: in-process, plus Redis when `redis_url` is set, else a SQLite
    file in `shared_dir` when the server's worker processes share one (several gunicorn workers)."""
    local = MemoryResultCache(max_entries=config.cache_size, ttl_s=config.cache_ttl_s)
    shared: SharedStore | None = None
    if config.shared_dir and not config.redis_url:
        shared = SqliteResultCache(Path(config.shared_dir) / SQLITE_FILE, ttl_s=config.cache_ttl_s,
                                   max_entries=config.cache_size, observer=observer)
        log.info("answers shared by the worker processes through sqlite", extra={"fields": {"path": str(shared.path)}})
    if config.redis_url:
        shared = RedisResultCache.from_url(config.redis_url, ttl_s=config.cache_ttl_s, observer=observer)
        # The URL may hold a password: it is not logged.
        log.info("answers shared through redis", extra={"fields": {
            "key_prefix": REDIS_KEY_PREFIX, "timeout_s": REDIS_TIMEOUT_S, "breaker_failures": BREAKER_FAILURES,
            "breaker_cooldown_s": BREAKER_COOLDOWN_S}})
    return LayeredResultCache(local, shared, observer)
