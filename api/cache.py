"""Answers already computed, keyed by esun_uuid, so that a retry is answered at once.

`ResultCache` is the interface the views use (get/put). Three implementations:

- `MemoryResultCache`: the in-process LRU with a time-to-live (the default, and the first level of the next);
- `RedisResultCache`: answers shared by every replica behind the load balancer, so a retry that lands on
  another replica than its first attempt still gets the corrected answer;
- `LayeredResultCache`: the one the app serves with: the local cache first, then Redis when `redis_url` is set,
  and it counts hits and misses per level. It writes to Redis through a `WriteBehind`: one daemon thread.

Redis is a help, never a dependency: every Redis call has short socket timeouts and no retries, and a
`CircuitBreaker` stops calling a Redis that keeps failing, so a dead or slow Redis costs at most a few
`timeout_s` every `cooldown_s` and the service answers from the local cache (or TOP1) within its budget.
A Redis that is slow but answers (30 ms a SET) never trips the breaker, so writes do not wait for it at all:
they are queued for the writer thread, and dropped (counted) when the queue is full. Reads stay synchronous.
Values are JSON text (`{"answer": "..."}`), read back with `json.loads` and checked: never pickle, so a value
planted in Redis by someone else can at worst be ignored, never run.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import threading
import time
from collections import OrderedDict
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
# Writes waiting for Redis: at 30 ms a SET, a full queue is half a minute behind; later ones are dropped.
WRITE_QUEUE_SIZE = 1024
# How long a closing writer (or the process's exit) waits for the queued writes to land.
WRITE_DRAIN_S = 1.0


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


class WriteBehind:
    """Run `write(key, value)` on one daemon thread, so that a slow store never holds up the thread that asks.

    `submit` only queues and returns: the caller may be the batcher's single worker thread, settling a batch
    of futures whose callbacks store answers, and 64 synchronous 30 ms writes there would make the rest of
    the batch and the next one miss the judge's deadline. The queue is bounded (`max_pending`); a write for a
    key already queued replaces it (the latest answer wins, and the queue does not grow); a write that finds
    the queue full or the writer closed is dropped and counted in `dropped`, with one warning per burst.
    A `write` that raises is logged and the thread goes on with the next. The thread starts with the first
    write (so an app built before a fork starts it in the process that serves), and `close` stops it once the
    queue is drained; it is also called at exit, since a daemon thread would die with its queue unwritten.
    """

    def __init__(self, write: Callable[[str, str], None], max_pending: int = WRITE_QUEUE_SIZE,
                 name: str = "cache-writer") -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._write = write
        self._max_pending = max_pending
        self._name = name
        self._pending: OrderedDict[str, str] = OrderedDict()
        self._cond = threading.Condition()
        self._writing = False  # a write taken off the queue has not returned yet
        self._closed = False
        self._dropping = False  # writes were dropped since the queue was last empty: warned already
        self._dropped = 0
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """How many writes were dropped (queue full, or submitted after `close`)."""
        with self._cond:
            return self._dropped

    @property
    def pending(self) -> int:
        """How many writes wait in the queue (the one being written not included)."""
        with self._cond:
            return len(self._pending)

    def submit(self, key: str, value: str) -> bool:
        """Queue a write and return at once: True when queued, False when dropped."""
        with self._cond:
            full = key not in self._pending and len(self._pending) >= self._max_pending
            if not (self._closed or full):
                self._pending[key] = value
                self._start()
                self._cond.notify_all()
                return True
            self._dropped += 1
            warn, self._dropping = not self._dropping, True
            dropped, closed = self._dropped, self._closed
        if warn:
            log.warning("cache write dropped: the writer is %s", "closed" if closed else "behind",
                        extra={"fields": {"writer": self._name, "max_pending": self._max_pending,
                                          "dropped_total": dropped}})
        return False

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write has returned; False when `timeout` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._writing, timeout)

    def close(self, timeout: float = WRITE_DRAIN_S) -> None:
        """Refuse new writes, let the thread write what is queued, and wait up to `timeout` for it to stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("cache writer still busy after close", extra={"fields": {
                    "writer": self._name, "timeout_s": timeout, "pending": self.pending}})

    def _start(self) -> None:
        # Called with the lock held. is_alive(): a thread does not survive a fork of its process.
        if self._thread is not None and self._thread.is_alive():
            return
        first = self._thread is None
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if first:
            # Drain the queue before exit, so that a stopping replica's last answers land.
            atexit.register(self.close, WRITE_DRAIN_S)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return  # closed, and nothing left to write
                key, value = self._pending.popitem(last=False)
                self._writing = True
            try:
                self._write(key, value)
            except Exception:
                log.exception("cache write failed", extra={"fields": {"writer": self._name}})
            finally:
                with self._cond:
                    self._writing = False
                    if not self._pending:
                        self._dropping = False  # caught up: the next drop starts a new burst, worth a warning
                    self._cond.notify_all()


class LayeredResultCache:
    """The local cache first, then (if any) the shared one; answers found in the shared one are kept locally.

    `put` stores the answer locally at once, and hands the shared write to a `WriteBehind`: it never waits for
    Redis. `put` runs on the batcher's worker thread (api.predict stores answers from a done-callback), where
    one synchronous write per answer to a slow Redis would hold up the whole batch and the next. The answer is
    in Redis a moment after the response leaves (a retry on this replica reads the local cache first); a
    replica that stops drains its queue at exit (`close`), one that is killed loses the writes still queued.
    A put of the answer the local cache already holds is not written again: api.predict stores each answer
    twice (from the request's thread and from the callback), and a slow Redis should take it once.
    """

    def __init__(self, local: MemoryResultCache, shared: ResultCache | None = None,
                 observer: CacheObserver | None = None, max_pending_writes: int = WRITE_QUEUE_SIZE) -> None:
        self.local = local
        self.shared = shared
        self._observer = observer
        self.writer = WriteBehind(shared.put, max_pending_writes) if shared is not None else None

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
        """Store the answer locally, and queue it for the shared cache unless it is stored already."""
        known = self.local.get(esun_uuid)
        self.local.put(esun_uuid, answer)
        if self.writer is not None and known != answer:
            self.writer.submit(esun_uuid, answer)

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
