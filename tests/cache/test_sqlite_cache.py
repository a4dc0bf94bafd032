"""cache.sqlite_cache: the answers the worker processes of one server share without a server to run."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from cache import LayeredResultCache, MemoryResultCache, SqliteResultCache, build_cache
from cache.sqlite_cache import SQLITE_FILE
from config import Config


class Lookups:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def cache_lookup(self, level: str, result: str) -> None:
        self.seen.append((level, result))

    def redis_circuit(self, is_open: bool) -> None:
        pass


def _store_in_another_process(path: str, key: str, answer: str) -> None:
    SqliteResultCache(Path(path), ttl_s=60, max_entries=10).put(key, answer)


def test_an_answer_stored_by_one_process_is_read_by_another(tmp_path):
    path = tmp_path / SQLITE_FILE
    reader = SqliteResultCache(path, ttl_s=60, max_entries=10)
    writer = multiprocessing.get_context("spawn").Process(target=_store_in_another_process,
                                                          args=(str(path), "uuid#d", "改過的句子"))
    writer.start()
    writer.join(30)
    assert writer.exitcode == 0
    assert reader.get("uuid#d") == "改過的句子"
    assert reader.get("other#d") is None


def test_an_answer_is_forgotten_after_its_time_to_live(tmp_path):
    now = [1000.0]
    store = SqliteResultCache(tmp_path / SQLITE_FILE, ttl_s=5, max_entries=10, clock=lambda: now[0])
    store.put("k", "a")
    now[0] += 4.9
    assert store.get("k") == "a"
    now[0] += 0.2
    assert store.get("k") is None


def test_a_later_answer_replaces_an_earlier_one_and_the_store_keeps_at_most_max_entries(tmp_path, monkeypatch):
    monkeypatch.setattr("cache.sqlite_cache.PRUNE_EVERY_WRITES", 10)
    store = SqliteResultCache(tmp_path / SQLITE_FILE, ttl_s=60, max_entries=5)
    store.put("k", "old")
    store.put("k", "new")
    assert store.get("k") == "new"
    for i in range(19):
        store.put(f"q{i}", str(i))
    rows = sqlite3.connect(tmp_path / SQLITE_FILE).execute("SELECT count(*) FROM answers").fetchone()[0]
    assert rows <= 5 + 9  # pruned to max_entries at the 20th write, at most 9 written since
    assert store.get("q18") == "18"  # the newest are kept


def test_a_broken_file_reads_as_a_miss_and_loses_the_write_without_raising(tmp_path):
    seen = Lookups()
    store = SqliteResultCache(tmp_path / SQLITE_FILE, ttl_s=60, max_entries=10, observer=seen)
    store.put("k", "a")
    sqlite3.connect(tmp_path / SQLITE_FILE).execute("DROP TABLE answers")
    assert store.get("k") is None
    store.put("k", "b")  # no exception
    assert seen.seen[-1] == ("sqlite", "error")


def test_build_cache_shares_answers_through_sqlite_when_the_workers_share_a_folder(tmp_path):
    cache = build_cache(Config(shared_dir=str(tmp_path)))
    assert isinstance(cache.shared, SqliteResultCache)
    assert cache.shared.path == tmp_path / SQLITE_FILE
    cache.put("uuid#d", "答案")
    assert cache.flush()
    other = LayeredResultCache(MemoryResultCache(10, 60), SqliteResultCache(tmp_path / SQLITE_FILE, 60, 10))
    assert other.get_local("uuid#d") is None
    assert other.get_shared("uuid#d") == "答案"
    cache.close()


def test_build_cache_has_no_shared_level_for_one_worker_and_prefers_redis_when_set(tmp_path):
    assert build_cache(Config()).shared is None
    cache = build_cache(Config(shared_dir=str(tmp_path), redis_url="redis://127.0.0.1:1/0"))
    assert type(cache.shared).__name__ == "RedisResultCache"


def test_a_batch_of_answers_lands_in_one_transaction_and_counts_towards_pruning(tmp_path, monkeypatch):
    monkeypatch.setattr("cache.sqlite_cache.PRUNE_EVERY_WRITES", 10)
    store = SqliteResultCache(tmp_path / SQLITE_FILE, ttl_s=60, max_entries=5)
    commits: list[str] = []
    store._connect().set_trace_callback(lambda sql: commits.append(sql) if sql.startswith("COMMIT") else None)
    store.put_many([(f"q{i}", str(i)) for i in range(8)])
    assert commits == ["COMMIT"]  # one commit for the eight
    assert [store.get(f"q{i}") for i in range(8)] == [str(i) for i in range(8)]
    store.put_many([(f"r{i}", str(i)) for i in range(4)])  # the 12th write crosses the 10th: pruned to 5
    rows = sqlite3.connect(tmp_path / SQLITE_FILE).execute("SELECT count(*) FROM answers").fetchone()[0]
    assert rows == 5
    store.put_many([])  # nothing to write: no transaction
    assert commits == ["COMMIT", "COMMIT", "COMMIT"]  # the two batches and the prune
