"""The shared level: answers in Redis, as JSON text, for every replica behind the load balancer.

Named `redis_cache`, not `redis`, so that no reader (or tool run from this folder) mistakes it for the client.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache.breaker import BREAKER_COOLDOWN_S, BREAKER_FAILURES, CircuitBreaker
from cache.protocols import CacheObserver

log = logging.getLogger("api.cache")

# Defaults for Redis on the request path: loopback or same-rack answers take well under a millisecond.
REDIS_TIMEOUT_S = 0.05
REDIS_KEY_PREFIX = "esun:answer:"


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
        self.put_many([(esun_uuid, answer)])

    def put_many(self, items: list[tuple[str, str]]) -> None:
        """Store each (esun_uuid, answer) as `put` does, in one pipelined round trip (no transaction: each SET stands
        alone)."""
        if not items or not self._breaker.allow():
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for esun_uuid, answer in items:
                pipe.set(self._prefix + esun_uuid, _encode(answer), px=self._ttl_ms)
            pipe.execute()
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
