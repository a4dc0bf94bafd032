"""Answers already computed, keyed by esun_uuid, so that a retry is answered at once.

`ResultCache` is the interface the views use (get/put). Three implementations:

- `MemoryResultCache`: the in-process LRU with a time-to-live (the default, and the first level of the next);
- `RedisResultCache`: answers shared by every replica behind the load balancer, so a retry that lands on
  another replica than its first attempt still gets the corrected answer;
- `LayeredResultCache`: the one the app serves with: the local cache first, then Redis when `redis_url` is set,
  and it counts hits and misses per level.

Redis is a help, never a dependency: every Redis call has short socket timeouts and no retries, and a
`CircuitBreaker` stops calling a Redis that keeps failing, so a dead or slow Redis costs at most a few
`timeout_s` every `cooldown_s` and the service answers from the local cache (or TOP1) within its budget.
Values are JSON text (`{"answer": "..."}`), read back with `json.loads` and checked: never pickle, so a value
planted in Redis by someone else can at worst be ignored, never run.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis
from cachetools import TTLCache
from redis.backoff import NoBackoff
from redis.retry import Retry

from config import Config

log = logging.getLogger("api.cache")

# Defaults for Redis on the request path: loopback or same-rack answers take well under a millisecond.
REDIS_TIMEOUT_S = 0.05
REDIS_KEY_PREFIX = "esun:answer:"
BREAKER_FAILURES = 3
BREAKER_COOLDOWN_S = 5.0


class ResultCache(Protocol):
    """Where answers wait for the retry of their question."""

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question, or None."""
        ...

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer to this question, replacing any earlier one."""
        ...


class CacheObserver(Protocol):
    """What the cache reports to metrics: each lookup's level and result, and the breaker's state."""

    def cache_lookup(self, level: str, result: str) -> None:
        """Count one lookup: level "local" or "redis"; result "hit", "miss", "error" or "skipped"."""
        ...

    def redis_circuit(self, is_open: bool) -> None:
        """Record whether the Redis circuit breaker is open (Redis skipped)."""
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


class RedisResultCache:
    """Answers in Redis under `key_prefix + esun_uuid`, as JSON text, for `ttl_s`; shared by all replicas.

    Never raises: a Redis error, a timeout or an open breaker reads as a miss ("error" / "skipped" to the
    observer) and a lost write; a value that is not this cache's JSON is ignored and logged.
    """

    def __init__(self, client: Any, ttl_s: float, key_prefix: str = REDIS_KEY_PREFIX,
                 observer: CacheObserver | None = None, breaker_failures: int = BREAKER_FAILURES,
                 breaker_cooldown_s: float = BREAKER_COOLDOWN_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl_ms = max(1, math.ceil(ttl_s * 1000))
        self._prefix = key_prefix
        self._observer = observer
        self._breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s, clock, on_change=self._circuit_changed)

    @classmethod
    def from_url(cls, url: str, ttl_s: float, key_prefix: str = REDIS_KEY_PREFIX,
                 timeout_s: float = REDIS_TIMEOUT_S, observer: CacheObserver | None = None) -> RedisResultCache:
        """Connect lazily to the Redis at `url`, with `timeout_s` to connect and to answer, and no retries."""
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
        )
        return cls(client, ttl_s=ttl_s, key_prefix=key_prefix, observer=observer)

    @property
    def breaker(self) -> CircuitBreaker:
        return self._breaker

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer Redis holds for this question, or None (also when Redis cannot be asked)."""
        if not self._breaker.allow():
            self._count("skipped")
            return None
        try:
            raw = self._client.get(self._prefix + esun_uuid)
        except (redis.RedisError, OSError) as exc:
            self._failed("get", exc)
            return None
        self._breaker.succeeded()
        if raw is None:
            self._count("miss")
            return None
        answer = _decode(raw)
        if answer is None:
            log.warning("ignored a Redis value that is not a cached answer",
                        extra={"fields": {"esun_uuid": esun_uuid, "value_bytes": len(raw)}})
            self._count("miss")
            return None
        self._count("hit")
        return answer

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer for `ttl_s`; give up silently (logged once per outage) when Redis cannot take it."""
        if not self._breaker.allow():
            return
        try:
            self._client.set(self._prefix + esun_uuid, _encode(answer), px=self._ttl_ms)
        except (redis.RedisError, OSError) as exc:
            self._failed("put", exc)
            return
        self._breaker.succeeded()

    def _failed(self, operation: str, exc: BaseException) -> None:
        if operation == "get":
            self._count("error")
        opened = self._breaker.failed()
        # One line per outage, not per request: the breaker's opening is the event worth a warning.
        level = logging.WARNING if opened else logging.DEBUG
        log.log(level, "redis %s failed", operation,
                extra={"fields": {"error": f"{type(exc).__name__}: {exc}", "circuit_open": self._breaker.is_open}})

    def _circuit_changed(self, is_open: bool) -> None:
        if is_open:
            log.warning("redis circuit open: answering from the local cache only",
                        extra={"fields": {"cooldown_s": self._breaker.cooldown_s}})
        else:
            log.info("redis circuit closed: redis answers again")
        if self._observer is not None:
            self._observer.redis_circuit(is_open)

    def _count(self, result: str) -> None:
        if self._observer is not None:
            self._observer.cache_lookup("redis", result)


class LayeredResultCache:
    """The local cache first, then (if any) the shared one; answers found in the shared one are kept locally.

    `put` writes both, the shared one synchronously: the answer is in Redis before the response leaves, so a
    replica killed right after answering has not lost it for the retry that goes to another replica. `put` also
    runs on the batcher's worker thread (api.predict stores late answers from a done-callback): there a hung
    Redis costs one socket timeout per answer until the breaker opens, a few times per cooldown at most.
    """

    def __init__(self, local: MemoryResultCache, shared: ResultCache | None = None,
                 observer: CacheObserver | None = None) -> None:
        self.local = local
        self.shared = shared
        self._observer = observer

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer from the local cache, else from the shared one, else None."""
        answer = self.local.get(esun_uuid)
        self._count("hit" if answer is not None else "miss")
        if answer is not None or self.shared is None:
            return answer
        answer = self.shared.get(esun_uuid)
        if answer is not None:
            self.local.put(esun_uuid, answer)
        return answer

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer locally and in the shared cache."""
        self.local.put(esun_uuid, answer)
        if self.shared is not None:
            self.shared.put(esun_uuid, answer)

    def _count(self, result: str) -> None:
        if self._observer is not None:
            self._observer.cache_lookup("local", result)


def build_cache(config: Config, observer: CacheObserver | None = None) -> LayeredResultCache:
    """Build the result cache the config asks for: in-process, plus Redis when `redis_url` is set."""
    local = MemoryResultCache(max_entries=config.cache_size, ttl_s=config.cache_ttl_s)
    shared = None
    if config.redis_url:
        shared = RedisResultCache.from_url(config.redis_url, ttl_s=config.cache_ttl_s, observer=observer)
        # The URL may hold a password: it is not logged.
        log.info("answers shared through redis", extra={"fields": {
            "key_prefix": REDIS_KEY_PREFIX, "timeout_s": REDIS_TIMEOUT_S, "breaker_failures": BREAKER_FAILURES,
            "breaker_cooldown_s": BREAKER_COOLDOWN_S}})
    return LayeredResultCache(local, shared, observer)


def _encode(answer: str) -> str:
    return json.dumps({"answer": answer}, ensure_ascii=False)


def _decode(raw: bytes | str) -> str | None:
    """Read a value this cache wrote; None for anything else (another program's value, pickle, garbage)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    answer = value.get("answer") if isinstance(value, dict) else None
    return answer if isinstance(answer, str) and answer else None
