"""Structured logs: one JSON object per line, one line per inference request.

Code logs with `extra={"fields": {...}}`; the formatter merges those fields into the line, e.g.
`{"ts": ..., "level": "INFO", "logger": "api.requests", "msg": "inference", "esun_uuid": "...",
"path": "model", "latency_ms": 41.2, "batch_size": 7}`.

No line waits for stderr on the answer path (issue 40: a reader that stopped reading stopped the service): every
line goes through the process's log writer (`sidecar.log_writer`: a bounded queue, one writer thread), dropped and
counted when the queue is full. The answers TOP1 for overload (`AnswerPath.under_load`) write their request line at
INFO, as any answer, and at most one WARNING line a second per path with their count (`OverloadSums`): under
overload the warnings do not grow with the load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from api.paths import AnswerPath
from sidecar import log_writer
from sidecar.log_writer import LOG_WRITER, JsonFormatter, StderrHandler, json_line

REQUEST_LOG = logging.getLogger("api.requests")
# The WARNING lines that sum the overload answers of a path (`OverloadSums`); a child of REQUEST_LOG's level, not
# one of its lines (tools count REQUEST_LOG's lines as answers).
SUMMED_LOG = logging.getLogger("api.requests.summed")


# The project's own packages log at the configured level; everything else (libraries) at WARNING and above.
OWN_PACKAGES = ("api", "batching", "cache", "model", "preprocess", "config")


def configure_logging(level: str) -> None:
    """Send every record to stderr as one JSON line, through one handler on the root logger (safe to call again):
    the project's packages at `level`, other packages' at WARNING and above, so nothing reaches stderr as plain
    text (a batcher's dead worker, a library's warning) and no warning is lost."""
    # What a record would otherwise gather and no line shows (the logging HOWTO's "Optimization"): the caller's frame
    # (a stack walk), thread and process names and ids; 14 µs of a request's log line.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    for name in OWN_PACKAGES:
        logging.getLogger(name).setLevel(level)
    # service-streamer 0.1.2 sets its own logger to INFO at import and writes a line per batch: its warnings only
    logging.getLogger("service_streamer.service_streamer").setLevel(logging.WARNING)


def log_request(esun_uuid: str, retry: int, path: AnswerPath, latency_ms: float,
                batch_size: int | None, reason: str | None, queued_ms: float | None = None) -> None:
    """Write the one line that describes an answered inference request.

    `latency_ms` counts from the request's accept (api.accept), `queued_ms` from there to its view's start. A
    degraded answer's line is a WARNING, but an overload answer's (`AnswerPath.under_load`) is INFO, its WARNING
    summed with the path's others (`OverloadSums`).
    """
    fields = {"esun_uuid": esun_uuid, "retry": retry, "path": path.value, "latency_ms": round(latency_ms, 2),
              "batch_size": batch_size}
    if queued_ms is not None:
        fields["queued_ms"] = round(queued_ms, 2)
    if reason:
        fields["reason"] = reason
    if path.under_load:
        OVERLOAD_SUMS.add(path)
        level = logging.INFO
    else:
        level = logging.WARNING if path.degraded else logging.INFO
    handler = _sole_handler(level)
    if handler is None:
        REQUEST_LOG.log(level, "inference", extra={"fields": fields})
        return
    try:  # the line the handler's record would have made, without the record: half of a door answer's log CPU
        handler.write(json_line(time.time(), logging.getLevelName(level), REQUEST_LOG.name, "inference", fields))
    except Exception:  # through logging, whose handler reports what failed (Handler.handleError)
        REQUEST_LOG.log(level, "inference", extra={"fields": fields})


def _sole_handler(level: int) -> StderrHandler | None:
    """The project's stderr handler if it is the only one a request line at `level` reaches, with nothing to filter
    on the way (a test's capture adds a handler: then the line goes through logging as any other)."""
    if not REQUEST_LOG.isEnabledFor(level):
        return None
    found = None
    logger: logging.Logger | None = REQUEST_LOG
    while logger is not None:
        if logger.filters:
            return None
        for handler in logger.handlers:
            if found is not None or type(handler) is not StderrHandler or handler.filters or level < handler.level:
                return None
            found = handler
        logger = logger.parent if logger.propagate else None
    return found


class OverloadSums:
    """Count the answers of each overload path and write at most one WARNING line per path every `every_s`, with
    the count since the last one: the first at once, then at the first answer `every_s` after, or at the writer's
    next tick (`flush_due`) if no answer comes. Thread safe (one lock; the event loop and request threads add)."""

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[AnswerPath, int] = {}
        self._last: dict[AnswerPath, float] = {}

    def add(self, path: AnswerPath) -> None:
        """Count one answer of `path`; write its WARNING line if one is due."""
        now = self._clock()
        with self._lock:
            count = self._pending.get(path, 0) + 1
            last = self._last.get(path)
            if last is not None and now - last < self.every_s:
                self._pending[path] = count
                return
            self._pending[path], self._last[path] = 0, now
        _warn(path, count, None if last is None else now - last)

    def flush_due(self) -> None:
        """Write the WARNING line of each path whose answers wait to be told and whose line is due."""
        now = self._clock()
        due = []
        with self._lock:
            for path, count in self._pending.items():
                last = self._last[path]
                if count and now - last >= self.every_s:
                    due.append((path, count, now - last))
                    self._pending[path], self._last[path] = 0, now
        for path, count, since_s in due:
            _warn(path, count, since_s)


def _warn(path: AnswerPath, count: int, since_s: float | None) -> None:
    fields = {"path": path.value, "answers": count, "since_s": None if since_s is None else round(since_s, 3),
              "reason": path.reason}
    SUMMED_LOG.warning("answered TOP1 under load", extra={"fields": fields})


OVERLOAD_SUMS = OverloadSums()
# The sums due are written at the process's log writer's ticks (sidecar.log_writer), when no answer comes to add one.
LOG_WRITER.every_tick(OVERLOAD_SUMS.flush_due)


def log_writer_trouble() -> str | None:
    """Say why the process's log writer is not well (/readyz), else None."""
    return log_writer.LOG_WRITER.trouble()
