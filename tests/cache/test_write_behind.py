"""cache writes to Redis on one writer thread: a slow Redis never holds up the thread that stores answers.

The batcher's single worker thread stores every model answer (api.answers' done-callback); a Redis that takes
30 ms a SET, too slow to be useful but never slow enough to trip the breaker, must not cost it 30 ms an answer.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from api.state import EXTENSION_KEY
from cache import LayeredResultCache, MemoryResultCache, WriteBehind
from preprocess.text import NBest
from tests.cache.test_result_cache import redis_cache
from tests.fakes import FakeRedis

SET_DELAY_S = 0.03


class SlowRedis(FakeRedis):
    """A Redis that answers, slowly: `delay_s` per call, well within the client's 50 ms socket timeout."""

    def __init__(self, delay_s: float = SET_DELAY_S) -> None:
        super().__init__()
        self.delay_s = delay_s

    def get(self, key: str) -> bytes | None:
        time.sleep(self.delay_s)
        return super().get(key)

    def set(self, key: str, value: str, px: int) -> None:
        time.sleep(self.delay_s)
        super().set(key, value, px)


class GatedRedis(FakeRedis):
    """A Redis whose set() waits for `gate`; `writing` is set when the first set() starts waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.writing = threading.Event()

    def set(self, key: str, value: str, px: int) -> None:
        self.writing.set()
        self.gate.wait(timeout=10)
        super().set(key, value, px)


class FailingOnceRedis(FakeRedis):
    """A Redis whose first set() raises `first_error`; the later ones succeed."""

    def __init__(self, first_error: Exception) -> None:
        super().__init__()
        self.first_error: Exception | None = first_error

    def set(self, key: str, value: str, px: int) -> None:
        error, self.first_error = self.first_error, None
        if error is not None:
            self.calls += 1
            raise error
        super().set(key, value, px)


MakeLayered = Callable[..., LayeredResultCache]


@pytest.fixture
def make_layered() -> Iterator[MakeLayered]:
    """Build layered caches over a fake Redis; close their writer threads after the test."""
    made: list[LayeredResultCache] = []

    def make(client: FakeRedis, max_pending_writes: int = 1024) -> LayeredResultCache:
        cache = LayeredResultCache(MemoryResultCache(max_entries=1000, ttl_s=60), redis_cache(client),
                                   max_pending_writes=max_pending_writes)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close(timeout=2.0)


def stored(client: FakeRedis, esun_uuid: str) -> str | None:
    raw = client.data.get("test:" + esun_uuid)
    return json.loads(raw)["answer"] if raw is not None else None


def writer_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll condition until it holds or timeout passes; return its last value."""
    until = time.monotonic() + timeout
    while not condition() and time.monotonic() < until:
        time.sleep(0.005)
    return condition()


def test_storing_64_answers_returns_at_once_while_redis_takes_30ms_a_write_and_they_land_soon_after(make_layered):
    client = SlowRedis()
    cache = make_layered(client)
    answers = {f"q{i}": f"答{i}" for i in range(64)}

    started = time.monotonic()
    for esun_uuid, answer in answers.items():
        cache.put(esun_uuid, answer)
    took = time.monotonic() - started

    assert took < 0.2, took  # 64 synchronous writes would take 64 * 30 ms = 1.9 s
    assert {q: cache.get_local(q) for q in answers} == answers  # from memory, at once
    assert cache.flush(timeout=10)
    assert {q: stored(client, q) for q in answers} == answers
    assert client.ttl_ms["test:q0"] == 60_000


def test_a_full_write_queue_drops_and_counts_writes_without_blocking(make_layered, caplog):
    client = GatedRedis()
    cache = make_layered(client, max_pending_writes=4)
    cache.put("q0", "答0")
    assert client.writing.wait(timeout=2)  # the writer holds q0 in a set() that does not return

    started = time.monotonic()
    for i in range(1, 11):
        cache.put(f"q{i}", f"答{i}")  # q1-q4 fill the queue, q5-q10 are dropped
    took = time.monotonic() - started

    assert took < 0.1, took
    assert cache.writer is not None and cache.writer.dropped == 6 and cache.writer.pending == 4
    assert all(cache.get_local(f"q{i}") == f"答{i}" for i in range(11))  # memory holds them all
    assert sum("cache write dropped" in r.getMessage() for r in caplog.records) == 1  # one per backlog

    client.gate.set()
    assert cache.flush(timeout=2)
    assert sorted(k.removeprefix("test:") for k in client.data) == ["q0", "q1", "q2", "q3", "q4"]


def test_settled_waits_for_its_own_keys_write_and_no_longer():
    redis = GatedRedis()
    writer = WriteBehind(lambda items: [redis.set(key, value, px=1000) for key, value in items])
    try:
        assert writer.settled("never-queued", timeout=0)  # nothing to wait for
        writer.submit("a", "甲")
        assert redis.writing.wait(2)
        writer.submit("b", "乙")
        assert not writer.settled("a", timeout=0.05)  # being written: Redis holds it
        assert not writer.settled("b", timeout=0.05)  # queued behind it
        landed: list[bool] = []
        waiter = threading.Thread(target=lambda: landed.append(writer.settled("b", timeout=5)))
        waiter.start()
        redis.gate.set()
        waiter.join(5)
        assert landed == [True] and redis.get("b") is not None
        assert writer.settled("a", timeout=0)
    finally:
        redis.gate.set()
        writer.close()


def test_a_new_answer_for_a_queued_question_replaces_it_without_growing_the_queue():
    gate, written = threading.Event(), []
    writer = WriteBehind(lambda items: (gate.wait(10), written.extend(items)), max_pending=2)
    try:
        assert writer.submit("busy", "0")
        assert wait_for(lambda: writer.pending == 0)  # taken by the thread, held at the gate
        assert writer.submit("q1", "舊") and writer.submit("q2", "二")
        assert writer.submit("q1", "新")  # the queue is full, but q1 is in it already
        assert writer.dropped == 0
        gate.set()
        assert writer.flush(timeout=2)
        assert written == [("busy", "0"), ("q1", "新"), ("q2", "二")]
    finally:
        gate.set()
        writer.close(timeout=2)


@pytest.mark.parametrize("error", [RuntimeError("a bug in the client"), redis.ConnectionError("reset by peer")],
                         ids=["unexpected", "redis-error"])
def test_a_redis_set_that_raises_does_not_kill_the_writer_thread(make_layered, error, caplog):
    client = FailingOnceRedis(error)
    cache = make_layered(client)
    cache.put("q1", "一")
    assert cache.flush(timeout=2)
    cache.put("q2", "二")
    cache.put("q3", "三")
    assert cache.flush(timeout=2)
    assert (stored(client, "q1"), stored(client, "q2"), stored(client, "q3")) == (None, "二", "三")
    if isinstance(error, RuntimeError):
        assert any("cache write failed" in r.getMessage() for r in caplog.records)


def test_an_answer_put_twice_is_written_to_redis_once(make_layered):
    client = FakeRedis()
    cache = make_layered(client)
    cache.put("q1", "答")  # api.answers stores each answer from the request's thread and from the callback
    cache.put("q1", "答")
    assert cache.flush(timeout=2)
    assert client.calls == 1
    cache.put("q1", "另一個答")
    assert cache.flush(timeout=2)
    assert client.calls == 2 and stored(client, "q1") == "另一個答"


def test_writer_thread_starts_with_the_first_write_and_close_writes_the_queue_then_stops_it():
    name = "test-writer-close"
    written: list[tuple[str, str]] = []

    def slow_write(items: list[tuple[str, str]]) -> None:
        time.sleep(0.01)
        written.extend(items)

    writer = WriteBehind(slow_write, name=name)
    assert writer_threads(name) == []
    for i in range(5):
        assert writer.submit(f"q{i}", str(i))
    assert len(writer_threads(name)) == 1
    writer.close(timeout=2)
    assert written == [(f"q{i}", str(i)) for i in range(5)]
    assert writer_threads(name) == []
    assert writer.submit("late", "x") is False and writer.dropped == 1
    writer.close(timeout=2)  # again, as at exit: returns at once


def test_close_without_redis_or_writes_is_a_no_op():
    cache = LayeredResultCache(MemoryResultCache(max_entries=10, ttl_s=60))
    cache.put("q1", "答")
    assert cache.flush(timeout=0.1)
    cache.close()
    assert cache.get_local("q1") == "答"


def test_a_batch_of_16_gets_model_answers_within_budget_while_redis_is_slow(make_app, fake_corrector, config,
                                                                           make_body, request_paths):
    """End to end: with synchronous writes, the worker spent 16 * 30 ms storing answers, past the 0.3 s budget."""
    config = dataclasses.replace(config, max_batch_size=16, max_batch_wait_s=0.1, batch_policy="fixed",
                                 http_threads=32)
    corrector = fake_corrector()
    client = SlowRedis()
    app = make_app(config=config, corrector=corrector,
                   cache=LayeredResultCache(MemoryResultCache(max_entries=100, ttl_s=60), redis_cache(client)))
    state = app.extensions[EXTENSION_KEY]
    bodies = [make_body(sentences=[f"喂 你好 第 {i} 句", f"喂 你好 第 {i} 具"], esun_uuid=f"{i:064x}")
              for i in range(16)]
    results: dict[int, tuple[float, dict]] = {}
    start = threading.Barrier(len(bodies))

    def ask(i: int) -> None:
        http = app.test_client()
        start.wait(timeout=5)
        started = time.monotonic()
        response = http.post("/inference", json=bodies[i])
        results[i] = (time.monotonic() - started, response.get_json())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert request_paths() == ["model"] * len(bodies), [len(b) for b in corrector.batches]
        for i, body in enumerate(bodies):
            took, answer = results[i]
            assert answer["answer"] == corrector.expected(NBest(tuple(body["sentence_list"]))), i
            assert took < config.budget_s + 0.1, (i, took)
        assert state.cache.flush(timeout=5)
        # Keyed by esun_uuid (api.answers.cache_key adds a digest of the question to the key).
        assert all(any(key.startswith("test:" + body["esun_uuid"]) for key in client.data) for body in bodies)
    finally:
        state.cache.close(timeout=2)


def test_writes_queued_while_the_store_is_busy_reach_it_together_and_each_waiter_is_released():
    gate, calls = threading.Event(), []
    writer = WriteBehind(lambda items: (gate.wait(10), calls.append(list(items))), max_batch=40)
    try:
        writer.submit("first", "0")
        assert wait_for(lambda: writer.pending == 0)  # taken by the thread, held at the gate
        for i in range(100):
            writer.submit(f"q{i}", str(i))
        waiting = [writer.settled(f"q{i}", timeout=0) for i in (0, 99)]
        gate.set()
        assert writer.settled("q99", timeout=2) and writer.settled("q0", timeout=0)
        assert waiting == [False, False]
        assert [len(c) for c in calls] == [1, 40, 40, 20]  # the queue in batches of at most max_batch
        assert [key for c in calls for key, _ in c] == ["first", *(f"q{i}" for i in range(100))]  # in order
    finally:
        gate.set()
        writer.close(timeout=2)


def test_a_batch_that_fails_releases_its_waiters_and_the_writer_goes_on(caplog):
    written: list[tuple[str, str]] = []

    def write_many(items: list[tuple[str, str]]) -> None:
        if any(key == "bad" for key, _ in items):
            raise RuntimeError("the store refused the batch")
        written.extend(items)

    writer = WriteBehind(write_many)
    try:
        writer.submit("bad", "x")
        assert writer.settled("bad", timeout=2)  # failed and logged: nothing left to wait for
        writer.submit("good", "y")
        assert writer.flush(timeout=2) and written == [("good", "y")]
        assert any("cache write failed" in r.getMessage() for r in caplog.records)
    finally:
        writer.close(timeout=2)


def test_redis_takes_a_batch_of_answers_in_one_pipeline_and_a_failure_counts_once_toward_the_breaker():
    client = FakeRedis()
    cache = redis_cache(client)
    cache.put_many([("q1", "一"), ("q2", "二")])
    assert (stored(client, "q1"), stored(client, "q2")) == ("一", "二") and client.ttl_ms["test:q2"] == 60_000
    client.error = redis.ConnectionError("reset by peer")
    cache.put_many([("q3", "三"), ("q4", "四"), ("q5", "五")])
    assert stored(client, "q3") is None and not cache.breaker.is_open  # one failure of three allowed, not three
    cache.put_many([("q6", "六")])
    cache.put_many([("q7", "七")])
    assert cache.breaker.is_open
