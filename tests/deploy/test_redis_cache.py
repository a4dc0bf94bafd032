"""cache against a real redis-server: shared answers, TTL, pickle refused, and a dead or silent Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from api.state import EXTENSION_KEY
from cache import LayeredResultCache, MemoryResultCache, RedisResultCache, build_cache
from tests.cache.test_result_cache import UNPICKLED, Planted  # the same planted pickle, against a real Redis
from tests.deploy.procs import free_port

pytestmark = pytest.mark.live

@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A TCP listener that accepts connections and never answers: a hung Redis. Yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join(timeout=1)
    for conn in accepted:
        conn.close()
    listener.close()


def test_redis_cache_shares_answers_between_two_replicas(redis_server, redis_client, config):
    config = dataclasses.replace(config, redis_url=redis_server)
    first, second = build_cache(config), build_cache(config)
    first.put("q1", "喂你好密碼我要進去")
    assert first.flush(timeout=2)  # written to Redis by the cache's writer thread, a moment after put
    assert second.get_shared("q1") == "喂你好密碼我要進去"
    assert redis_client.get("esun:answer:q1").decode() == '{"answer": "喂你好密碼我要進去"}'
    assert 0 < redis_client.pttl("esun:answer:q1") <= config.cache_ttl_s * 1000


def test_redis_cache_forgets_answers_after_ttl(redis_server, redis_client):
    cache = RedisResultCache.from_url(redis_server, ttl_s=0.05)
    cache.put("q1", "答")
    time.sleep(0.15)
    assert cache.get("q1") is None


def test_redis_cache_ignores_a_planted_pickle_instead_of_unpickling_it(redis_server, redis_client, caplog):
    """Guards against service-streamer's RedisStreamer habit: it pickle.loads whatever Redis hands it."""
    redis_client.set("esun:answer:q1", pickle.dumps(Planted()))
    cache = RedisResultCache.from_url(redis_server, ttl_s=60)
    assert cache.get("q1") is None
    assert UNPICKLED == []
    assert any("not a cached answer" in r.getMessage() for r in caplog.records)


def test_layered_cache_answers_locally_within_milliseconds_when_redis_is_dead():
    cache = LayeredResultCache(MemoryResultCache(10, 60),
                               RedisResultCache.from_url(f"redis://127.0.0.1:{free_port()}/0", ttl_s=60))
    started = time.monotonic()
    cache.put("q1", "答")
    for _ in range(20):
        assert cache.get_local("q1") == "答"
        assert cache.get_local("q2") is None and cache.get_shared("q2") is None
    assert time.monotonic() - started < 0.5
    assert cache.shared.breaker.is_open


def test_redis_cache_gives_up_on_a_silent_redis_after_its_socket_timeout_then_skips_it(silent_redis, caplog):
    cache = RedisResultCache.from_url(silent_redis, ttl_s=60, timeout_s=0.05)
    took = []
    for _ in range(6):
        started = time.monotonic()
        assert cache.get("q1") is None
        took.append(time.monotonic() - started)
    assert all(t < 0.2 for t in took[:3]), took  # one 50 ms timeout each, no retries
    assert cache.breaker.is_open
    assert all(t < 0.01 for t in took[3:]), took  # circuit open: Redis not asked
    assert sum("circuit open" in r.getMessage() for r in caplog.records) == 1


def test_inference_answers_within_budget_when_redis_hangs(make_app, config, silent_redis, make_body):
    app = make_app(config=dataclasses.replace(config, redis_url=silent_redis))
    client = app.test_client()
    # First attempts read the local level only; a retry this replica has no answer for asks Redis (hanging).
    for body in [make_body(esun_uuid=f"{kind}{i}", retry=retry) for i in range(5) for kind, retry in (("q", 2),
                                                                                                      ("r", 1))]:
        started = time.monotonic()
        response = client.post("/inference", json=body)
        assert response.status_code == 200
        assert time.monotonic() - started < config.budget_s
    # The answer kept locally still serves the retry.
    assert client.post("/inference", json=make_body(esun_uuid="q0", retry=1)).get_json()["answer"].startswith("改")
    assert app.extensions[EXTENSION_KEY].cache.shared.breaker.is_open


def test_retry_on_another_replica_gets_the_model_answer_from_redis(make_app, config, redis_server, redis_client,
                                                                   make_body, request_paths):
    config = dataclasses.replace(config, redis_url=redis_server)
    first, second = make_app(config=config).test_client(), make_app(config=config).test_client()
    answer = first.post("/inference", json=make_body()).get_json()["answer"]
    assert answer.startswith("改")
    # The judge retries after its timeout; by then the first replica's writer thread has stored the answer.
    assert first.application.extensions[EXTENSION_KEY].cache.flush(timeout=2)
    assert second.post("/inference", json=make_body(retry=1)).get_json()["answer"] == answer
    assert request_paths() == ["model", "retry_cached"]
