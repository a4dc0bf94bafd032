"""The process's log lines on their way to stderr: one JSON object per line, never waited for on the request path.

No line waits for stderr on the answer path (issue 40: a reader that stopped reading stopped the service): in
gunicorn's master and worker every line goes through a bounded queue to one writer thread (`LogWriter`), dropped and
counted when the queue is full. `StderrHandler` is the logging handler that hands each record's line (`JsonFormatter`,
`json_line`) to the process's one writer, `LOG_WRITER`, started and stopped by `sidecar.lifecycle`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object, with the fields passed in `extra={"fields": ...}` (and its `pid`)."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        if self.with_pid:
            fields = {"pid": os.getpid(), **fields}  # record.process is not filled in (configure_logging)
        if record.exc_info:
            # Tracebacks go to the log, never to the client.
            fields = {**fields, "exc": self.formatException(record.exc_info)}
        return json_line(record.created, record.levelname, record.name, record.getMessage(), fields)


def json_line(created: float, level: str, logger: str, msg: str, fields: dict[str, Any]) -> str:
    """One log line: the record's time, level, logger and message, then its fields."""
    line = {"ts": round(created, 3), "level": level, "logger": logger, "msg": msg, **fields}
    try:
        return orjson.dumps(line, default=str).decode()
    except orjson.JSONEncodeError:  # what orjson cannot write (an integer past 64 bits, a key not a string)
        return json.dumps(line, ensure_ascii=False, default=str)


# Lines a process's writer holds while its stderr is slow: about 0.5 MB of request lines, and 0.4 s of them at 5,000
# answers/s. Past it a line is dropped and counted, never waited for (issue 40).
LOG_QUEUE_LINES = 2048
# A writer stuck in one write() this long makes /readyz 503: its reader has stopped reading.
LOG_STUCK_AFTER_S = 3.0
# Whole lines per write() to a pipe at most: a write of up to PIPE_BUF bytes is never cut into another process's
# (gunicorn's master and its workers share one stderr).
PIPE_CHUNK_BYTES = select.PIPE_BUF
# How often an idle writer wakes: to say how many lines it dropped, and to write the overload sums that are due.
TICK_S = 1.0


class LogWriter:
    """One process's log lines on their way to stderr: `put` never blocks; one thread writes them.

    Started (`start`, in gunicorn's worker after its fork: no thread survives one), `put` appends a formatted line to
    a bounded queue and wakes the writer thread, which writes every line queued so far in as few write() calls as
    whole lines fit in `PIPE_CHUNK_BYTES`. When the queue holds `capacity` lines, `put` drops the line and counts it
    (`dropped`); once a write succeeds again the writer says how many it dropped, in one line of logger `api.logs`
(the name the line has always had: deploy/README.md documents it).
    A writer blocked in one write() (a pipe whose reader stopped reading) longer than `stuck_after_s` is `trouble`
    for /readyz. `stop` writes what is queued, waiting at most its timeout; then, and before `start` (tests,
    `python -m api`), `put` writes the line at once, on the caller's thread, as a StreamHandler would. A process
    forked from a started writer (gunicorn's worker, from its master) starts its own thread with its first line.

    Written by hand rather than with the stdlib's QueueHandler/QueueListener: QueueHandler's put_nowait raises
    queue.Full into `handleError`, which prints a traceback per dropped line; QueueListener writes each record with
    its own write() and carries records (a copy and a format each) where a line is all that is left to write.
    Thread safety: `put` from any thread (deque.append and len are atomic; the bound may be passed by a few lines at
    once, never more than the threads that put at that moment); the writer alone takes lines and writes.
    """

    def __init__(self, capacity: int = LOG_QUEUE_LINES, stuck_after_s: float = LOG_STUCK_AFTER_S,
                 on_tick: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        self.stuck_after_s = stuck_after_s
        self._on_tick = on_tick
        self._lines: deque[str] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._abandoned = False  # stopped while its thread was stuck: later lines are dropped, not waited for
        self._dropped = 0
        self._reported = 0
        self._count_lock = threading.Lock()
        self._writing_since = 0.0
        self._restart_after_fork = False
        os.register_at_fork(after_in_child=self._forget_thread)

    @property
    def dropped(self) -> int:
        """Lines dropped so far because the queue was full (or stderr refused them)."""
        return self._dropped

    def every_tick(self, call: Callable[[], None]) -> None:
        """Have the writer's thread call `call` at each of its ticks (at least every `TICK_S`), after its lines."""
        self._on_tick = call

    def start(self) -> LogWriter:
        """Write through the queue from now on, on a new thread (once per process)."""
        self._restart_after_fork = False
        if self._thread is None:
            self._stopping = self._abandoned = False
            self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
            self._thread.start()
        return self

    def put(self, line: str) -> None:
        """Queue one formatted line (no newline) without blocking; drop and count it when the queue is full."""
        if self._thread is None and self._restart_after_fork:
            self.start()  # the first line of a child forked from a started writer (gunicorn's worker, booting)
        if self._thread is None:
            if self._abandoned:
                self._count_dropped(1)
            else:
                self._write([line], on_writer=False)
            return
        if len(self._lines) >= self.capacity:
            self._count_dropped(1)
            return
        self._lines.append(line)
        if not self._wake.is_set():
            self._wake.set()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued line is written (tools and tests); False if the writer is stuck past timeout_s."""
        deadline = time.monotonic() + timeout_s
        while self._thread is not None and (self._lines or self._writing_since):
            if time.monotonic() > deadline:
                return False
            self._wake.set()
            time.sleep(0.001)
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (waiting at most timeout_s for a stuck stderr), then stop the thread."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake.set()
        thread.join(timeout_s)
        self._abandoned = thread.is_alive()
        if self._abandoned:
            self._count_dropped(len(self._lines))
            self._lines.clear()
        self._thread = None
        for line in self._take():  # put while the writer was ending: written at once, as lines from now on
            self.put(line)

    def stuck_for_s(self) -> float:
        """How long the writer has been blocked in its current write(), 0 when it is not writing."""
        since = self._writing_since
        return time.monotonic() - since if since else 0.0

    def trouble(self) -> str | None:
        """Say why the log writer is not well (for /readyz): stuck in a write() past `stuck_after_s`, else None."""
        stuck_s = self.stuck_for_s()
        if stuck_s <= self.stuck_after_s:
            return None
        return (f"the log writer has been stuck writing to stderr for {stuck_s:.1f} s (its reader stopped reading?); "
                f"{self._dropped} log lines dropped so far")

    def _run(self) -> None:
        while True:
            self._wake.wait(TICK_S)
            self._wake.clear()
            lines = self._take()
            try:
                if lines:
                    self._write(lines, on_writer=True)
                if self._on_tick is not None and not self._stopping:
                    self._on_tick()
            except Exception:  # a bug or a broken stream must not end the writer, nor print a traceback
                self._count_dropped(len(lines))
            if self._stopping and not self._lines:
                return

    def _take(self) -> list[str]:
        lines, pop = [], self._lines.popleft
        for _ in range(len(self._lines)):
            lines.append(pop())
        return lines

    def _write(self, lines: list[str], on_writer: bool) -> None:
        """Write lines to whatever sys.stderr is now (test runners swap it): through its file descriptor, whole
        lines per write() (on the writer, at most PIPE_CHUNK_BYTES of them); a stderr without one (a test's
        capture) through its own `write`."""
        stream = sys.stderr
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
            stream.write("".join(line + "\n" for line in lines))
            return
        stream.flush()  # what was written through the stream before comes first
        if not on_writer:  # one line, on the caller's thread
            self._write_fd(fd, [(lines[0] + "\n").encode("utf-8", "backslashreplace")], on_writer)
            return
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            data = (line + "\n").encode("utf-8", "backslashreplace")
            if chunk and size + len(data) > PIPE_CHUNK_BYTES:
                self._write_fd(fd, chunk, on_writer)
                chunk, size = [], 0
            chunk.append(data)
            size += len(data)
        if chunk:
            self._write_fd(fd, chunk, on_writer)

    def _write_fd(self, fd: int, chunk: list[bytes], on_writer: bool) -> None:
        data = memoryview(chunk[0] if len(chunk) == 1 else b"".join(chunk))
        if on_writer:
            self._writing_since = time.monotonic()
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # stderr closed (EPIPE, EBADF): nobody will read these lines
            self._count_dropped(len(chunk))
            return
        finally:
            if on_writer:
                self._writing_since = 0.0
        if on_writer and self._dropped > self._reported:
            self._report_dropped()

    def _report_dropped(self) -> None:
        """Say, now that a write went through, how many lines were dropped since the last time it was said."""
        total = self._dropped
        count, self._reported = total - self._reported, total
        line = json_line(time.time(), "WARNING", "api.logs", "log lines dropped: stderr was not taking them",
                         {"dropped": count, "dropped_total": total})
        self._write([line], on_writer=True)

    def _count_dropped(self, n: int) -> None:
        with self._count_lock:
            self._dropped += n

    def _forget_thread(self) -> None:
        """In a forked child: the parent's thread and queue are not there. A child of a started writer (gunicorn's
        master) starts its own with its first line: its first lines ("Booting worker") must not wait either."""
        self._restart_after_fork = self._thread is not None and not self._stopping
        self._thread = None
        self._lines = deque()
        self._wake = threading.Event()
        self._count_lock = threading.Lock()
        self._writing_since = 0.0
        self._stopping = self._abandoned = False


class StderrHandler(logging.Handler):
    """Hand each record, formatted as one line, to the process's `LOG_WRITER`, without the handler's lock.

    A StreamHandler formats and writes under one lock per handler: the 64 request threads a batch's answers wake at
    once queued on it, each wait a handoff of the GIL. Here each thread formats its own line and hands it on (the
    writer never cuts one line into another): 64 closed-loop clients got 458 / 531 / 489 answers/s with one
    write() per line and no lock, against 458 / 474 / 442 with the StreamHandler (the shipped model,
    `testing.ab --mode served` against 0cec722, three alternating rounds; docs/benchmarks.md). Named as the JSON
    handler of gunicorn's own loggers too (server/gunicorn_conf.py), so that no line in the worker blocks on stderr.
    """

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        """Filter and emit the record, without `Handler.handle`'s lock (`emit` needs none)."""
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            LOG_WRITER.put(self.format(record))
        except Exception:
            self.handleError(record)

    def write(self, line: str) -> None:
        """Hand on one formatted line."""
        LOG_WRITER.put(line)


# The process's one writer to stderr (one stderr per process, as GC_PAUSES in api.metrics is one GC): started after
# gunicorn's fork in each worker and in the master (`sidecar.lifecycle.start`), stopped at their exit
# (`sidecar.lifecycle.stop`). The request log's overload sums are written at its ticks (api.logs).
LOG_WRITER = LogWriter()
