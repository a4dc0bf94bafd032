"""The shared level without a server: answers in one SQLite file that every worker process of a server opens.

With several gunicorn workers (server/gunicorn_conf.py) a judge's retry may land in another process than its first
attempt; this file is where that process finds the answer. It needs nothing installed (sqlite3 is in Python's
standard library) and lives in the folder the master made for its workers (`Config.shared_dir`).

SQLite in write-ahead-log mode: readers never wait for a writer, and one writer at a time holds the file's lock for
the few microseconds of an insert (nothing is synced to disk: a power cut may lose answers, which a cache may).
Writes come from the layered cache's write-behind thread (cache.write_behind), never from the thread that answers,
as many as are queued in one transaction (`put_many`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cache.protocols import CacheObserver

log = logging.getLogger("api.cache")

# How long a statement waits for another process's write lock before it reads as a miss or a lost write.
SQLITE_TIMEOUT_S = 0.05
# Expired answers are deleted once every this many writes, and the oldest beyond `max_entries` with them.
PRUNE_EVERY_WRITES = 1000
SQLITE_FILE = "answers.sqlite3"

_SCHEMA = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT NOT NULL, expires REAL NOT NULL)"


class SqliteResultCache:
    """Answers in a SQLite file under their key, for `ttl_s` (wall clock, which every process shares).

    Never raises: a locked, full or broken file reads as a miss ("error" to the observer) and a lost write, logged
    once per burst. One connection per thread (sqlite3's connections belong to the thread that made them).
    """

    def __init__(self, path: Path, ttl_s: float, max_entries: int, observer: CacheObserver | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._observer = observer
        self._clock = clock
        self._local = threading.local()
        self._writes = 0
        self._failing = False
        self._connect()  # the file and its table exist, and a bad path fails at start, not at the first answer

    def get(self, esun_uuid: str) -> str | None:
        """Return the answer stored for this question and not expired, or None."""
        try:
            row = self._connect().execute("SELECT answer FROM answers WHERE key = ? AND expires > ?",
                                          (esun_uuid, self._clock())).fetchone()
        except sqlite3.Error as exc:
            self._failed("get", exc)
            self._count("error")
            return None
        self._failing = False
        self._count("miss" if row is None else "hit")
        return None if row is None else row[0]

    def put(self, esun_uuid: str, answer: str) -> None:
        """Store the answer for `ttl_s`, replacing any earlier one; every so often forget expired and excess ones."""
        self.put_many([(esun_uuid, answer)])

    def put_many(self, items: list[tuple[str, str]]) -> None:
        """Store each (esun_uuid, answer) as `put` does, in one transaction: one commit for a batch's answers."""
        if not items:
            return
        expires = self._clock() + self._ttl_s
        try:
            db = self._connect()
            with db:
                db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)",
                               [(esun_uuid, answer, expires) for esun_uuid, answer in items])
            before, self._writes = self._writes, self._writes + len(items)
            if self._writes // PRUNE_EVERY_WRITES != before // PRUNE_EVERY_WRITES:
                self._prune(db)
        except sqlite3.Error as exc:
            self._failed("put", exc)
            return
        self._failing = False

    def _prune(self, db: sqlite3.Connection) -> None:
        with db:
            db.execute("DELETE FROM answers WHERE expires <= ?", (self._clock(),))
            db.execute("DELETE FROM answers WHERE key IN (SELECT key FROM answers ORDER BY expires DESC "
                       "LIMIT -1 OFFSET ?)", (self._max_entries,))

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # Set up with time to wait (several workers open the file at once at start), then used with little.
            db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")
            db.execute(_SCHEMA)
            db.execute(f"PRAGMA busy_timeout = {round(SQLITE_TIMEOUT_S * 1000)}")
            db.isolation_level = "DEFERRED"  # `with db:` commits each write
            self._local.db = db
        return db

    def _failed(self, operation: str, exc: sqlite3.Error) -> None:
        # One line per burst of failures, not one per request.
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        log.log(level, "sqlite answer store %s failed", operation,
                extra={"fields": {"error": f"{type(exc).__name__}: {exc}", "path": str(self.path)}})

    def _count(self, result: str) -> None:
        if self._observer is not None:
            self._observer.cache_lookup("sqlite", result)
