"""api.cache.MemoryResultCache: answers kept by esun_uuid, forgotten after their TTL or when evicted."""

from __future__ import annotations

import threading

from api.cache import MemoryResultCache


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
