"""cache: answers kept by esun_uuid in process (TTL, LRU) and in Redis (JSON only, behind a circuit breaker)."""

from __future__ import annotations

import json
import pickle
import threading

import pytest
import redis

from cache import CircuitBreaker, LayeredResultCache, MemoryResultCache, RedisResultCache, build_cache
from cache.sqlite_cache import SqliteResultCache
from tests.fakes import FakeCacheObserver, FakeRedis


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_returns_what_was_put_and_none_otherwise():
    cache = MemoryResultCache(max_entries=10, ttl_s=60)
    cache.put("q1", "喂你好")
    assert cache.get("q1") == "喂你好"
    assert cache.get("q2") is None


def test_cache_forgets_answers_after_their_ttl():
    clock = Clock()
    cache = MemoryResultCache(max_entries=10, ttl_s=60, timer=clock)
    cache.put("q1", "喂你好")
    clock.now = 59.9
    assert cache.get("q1") == "喂你好"
    clock.now = 60.1
    assert cache.get("q1") is None


def test_cache_evicts_the_least_recently_used_when_full():
    cache = MemoryResultCache(max_entries=2, ttl_s=60)
    cache.put("q1", "一")
    cache.put("q2", "二")
    cache.get("q1")
    cache.put("q3", "三")
    assert (cache.get("q1"), cache.get("q2"), cache.get("q3")) == ("一", None, "三")


def test_cache_stays_consistent_under_concurrent_writers():
    cache = MemoryResultCache(max_entries=500, ttl_s=60)

    def writer(offset: int) -> None:
        for i in range(300):
            cache.put(f"q{offset}-{i}", "答")
            cache.get(f"q{offset}-{i // 2}")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 500


# --- Redis (a fake client here; tests/deploy/test_redis_cache.py runs the same against redis-server) ---

UNPICKLED: list[str] = []


def _record_unpickling(note: str) -> None:
    UNPICKLED.append(note)


class Planted:
    """A pickle that runs code when loaded: what a hostile or foreign writer could leave in Redis."""

    def __reduce__(self):
        return (_record_unpickling, ("code ran on unpickling",))


def redis_cache(client: FakeRedis, clock: Clock | None = None,
                observer: FakeCacheObserver | None = None) -> RedisResultCache:
    return RedisResultCache(client, ttl_s=60, key_prefix="test:", observer=observer, breaker_failures=3,
                            breaker_cooldown_s=5.0, clock=clock or Clock())


def test_redis_cache_stores_answers_as_json_under_prefix_with_ttl():
    client = FakeRedis()
    cache = redis_cache(client)
    cache.put("q1", "喂你好")
    assert json.loads(client.data["test:q1"]) == {"answer": "喂你好"}
    assert client.ttl_ms["test:q1"] == 60_000
    assert cache.get("q1") == "喂你好"
    assert cache.get("q2") is None


def test_redis_cache_ignores_a_planted_pickle_instead_of_unpickling_it(caplog):
    """Guards against service-streamer's RedisStreamer habit: it pickle.loads whatever Redis hands it."""
    client = FakeRedis()
    client.data["test:q1"] = pickle.dumps(Planted())
    cache = redis_cache(client)
    assert cache.get("q1") is None
    assert UNPICKLED == []
    assert any("not a cached answer" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("raw", [b'"just a string"', b'{"answer": 5}', b'{"answer": ""}', b"\xff\xfe", b"[1, 2]"])
def test_redis_cache_reads_anything_but_its_own_json_as_a_miss(raw):
    client = FakeRedis()
    client.data["test:q1"] = raw
    assert redis_cache(client).get("q1") is None


def test_redis_cache_opens_circuit_after_three_failures_and_skips_redis_until_cooldown(caplog):
    client, clock, observer = FakeRedis(), Clock(), FakeCacheObserver()
    cache = redis_cache(client, clock, observer)
    client.error = redis.TimeoutError("Timeout reading from socket")
    for _ in range(3):
        assert cache.get("q1") is None
    assert cache.breaker.is_open and observer.circuit == [True]
    assert sum("circuit open" in r.getMessage() for r in caplog.records) == 1  # one warning per outage
    calls = client.calls
    clock.now = 4.9
    cache.put("q1", "答")
    assert cache.get("q1") is None
    assert client.calls == calls  # not asked while open
    assert observer.lookups[-1] == ("redis", "skipped")


def test_redis_cache_closes_circuit_when_the_trial_after_cooldown_succeeds():
    client, clock, observer = FakeRedis(), Clock(), FakeCacheObserver()
    cache = redis_cache(client, clock, observer)
    client.error = redis.ConnectionError("Connection refused")
    for _ in range(3):
        cache.put("q1", "答")
    assert cache.breaker.is_open
    clock.now = 5.1
    client.error = None
    cache.put("q1", "答")
    assert not cache.breaker.is_open and observer.circuit == [True, False]
    assert cache.get("q1") == "答"


def test_redis_cache_reopens_circuit_when_the_trial_fails():
    client, clock = FakeRedis(), Clock()
    cache = redis_cache(client, clock)
    client.error = OSError("network unreachable")
    for _ in range(3):
        cache.get("q1")
    clock.now = 5.1
    assert cache.get("q1") is None  # the trial, failed
    calls = client.calls
    clock.now = 9.0
    assert cache.get("q1") is None
    assert client.calls == calls


def test_circuit_breaker_lets_one_trial_through_at_a_time():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    assert breaker.failed() is True
    clock.now = 1.5
    assert [breaker.allow(), breaker.allow()] == [True, False]
    breaker.succeeded()
    assert breaker.allow() and breaker.allow()


def test_layered_cache_reads_local_first_then_redis_and_keeps_redis_hits_locally():
    client, observer = FakeRedis(), FakeCacheObserver()
    shared = redis_cache(client, observer=observer)
    shared.put("q1", "從別的副本")
    cache = LayeredResultCache(MemoryResultCache(max_entries=10, ttl_s=60), shared, observer)
    assert cache.get_local("q1") is None
    assert cache.get_shared("q1") == "從別的副本"
    assert cache.local.get("q1") == "從別的副本"
    calls = client.calls
    assert cache.get_local("q1") == "從別的副本"
    assert client.calls == calls
    assert observer.lookups == [("local", "miss"), ("redis", "hit"), ("local", "hit")]


def test_layered_cache_writes_both_levels_and_answers_locally_while_redis_is_down():
    client = FakeRedis()
    cache = LayeredResultCache(MemoryResultCache(max_entries=10, ttl_s=60), redis_cache(client))
    cache.put("q1", "答")
    assert cache.flush(timeout=2)  # Redis is written by the cache's writer thread
    assert json.loads(client.data["test:q1"]) == {"answer": "答"}
    client.error = redis.ConnectionError("Connection refused")
    cache.put("q2", "二")
    assert (cache.get_local("q1"), cache.get_local("q2"), cache.get_shared("q3")) == ("答", "二", None)
    cache.close()


class PausingLocal(MemoryResultCache):
    """The local level, its first put paused once the answer is stored there: the moment another thread reads it."""

    def __init__(self) -> None:
        super().__init__(max_entries=10, ttl_s=60)
        self.stored = threading.Event()
        self.release = threading.Event()

    def put(self, esun_uuid: str, answer: str) -> None:
        super().put(esun_uuid, answer)
        if not self.stored.is_set():
            self.stored.set()
            self.release.wait(5)


def test_a_thread_that_finds_the_answer_already_stored_locally_still_waits_for_its_shared_write(tmp_path):
    """api.answers stores each model answer twice, from the batcher's callback and from the request's thread, which
    then waits for the shared write before the response leaves. The callback's local put may come first: the
    request's thread, finding the answer there, must still find its write to wait for (a retry sent at once to the
    other worker got TOP1 when it did not)."""
    shared = SqliteResultCache(tmp_path / "answers.sqlite3", ttl_s=60, max_entries=10)
    local = PausingLocal()
    cache = LayeredResultCache(local, shared)
    callback = threading.Thread(target=cache.put, args=("q1", "答"))
    callback.start()
    try:
        assert local.stored.wait(5)  # the callback's answer is in the local level, its thread paused there
        cache.put("q1", "答")  # the request's thread: the same answer, already local, so not queued again
        assert cache.wait_shared("q1", timeout=5)
        assert shared.get("q1") == "答"
    finally:
        local.release.set()
        callback.join(5)
        cache.close()


def test_build_cache_is_in_process_only_without_redis_url(config):
    cache = build_cache(config)
    assert cache.shared is None
    cache.put("q1", "答")
    assert (cache.get_local("q1"), cache.get_shared("q1")) == ("答", None)


def test_cache_entries_are_values_the_cyclic_gc_stops_tracking():
    """A served process holds 100,000 answers: every full collection scanned one tracked object per entry before."""
    import gc

    cache = MemoryResultCache(max_entries=1000, ttl_s=60)
    gc.collect()
    tracked = len(gc.get_objects())
    for i in range(1000):
        cache.put(f"q{i}", "答案" * 3)
    gc.collect()
    assert len(gc.get_objects()) - tracked < 50
    assert cache.get("q999") == "答案" * 3
