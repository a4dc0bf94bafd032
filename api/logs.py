"""Structured logs: one JSON object per line, one line per inference request.

Code logs with `extra={"fields": {...}}`; the formatter merges those fields into the line, e.g.
`{"ts": ..., "level": "INFO", "logger": "api.requests", "msg": "inference", "esun_uuid": "...",
"path": "model", "latency_ms": 41.2, "batch_size": 7}`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import orjson

from api.paths import AnswerPath

REQUEST_LOG = logging.getLogger("api.requests")


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


class _StderrHandler(logging.Handler):
    """Write each record to whatever sys.stderr is at the time (test runners swap it) as one line, in one `write()`
    to its file descriptor, formatted and written without the handler's lock.

    A StreamHandler formats and writes under one lock per handler: the 64 request threads a batch's answers wake at
    once queued on it, each wait a handoff of the GIL. One `os.write` of a whole line needs no lock (a line is never
    cut into another: a pipe takes a write of up to PIPE_BUF bytes whole, a file or terminal takes each write() whole
    on Linux), so the threads only share the GIL: 64 closed-loop clients got 458 / 531 / 489 answers/s with it against
    458 / 474 / 442 with the StreamHandler (the shipped model, `testing.ab --mode served` against 0cec722, three
    alternating rounds; docs/benchmarks.md). A stderr without a file descriptor (a test's capture) is written through
    its own `write`.
    """

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        """Filter and emit the record, without `Handler.handle`'s lock (`emit` needs none)."""
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:
            self.handleError(record)

    def write(self, line: str) -> None:
        """Write one formatted line."""
        line += "\n"
        stream = sys.stderr
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
            stream.write(line)
            return
        stream.flush()  # what was written through the stream before comes first
        data = memoryview(line.encode("utf-8"))
        while data:
            data = data[os.write(fd, data):]


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
        handler = _StderrHandler()
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

    `latency_ms` counts from the request's accept (api.accept), `queued_ms` from there to its view's start.
    """
    fields = {"esun_uuid": esun_uuid, "retry": retry, "path": path.value, "latency_ms": round(latency_ms, 2),
              "batch_size": batch_size}
    if queued_ms is not None:
        fields["queued_ms"] = round(queued_ms, 2)
    if reason:
        fields["reason"] = reason
    level = logging.WARNING if path.degraded else logging.INFO
    handler = _sole_handler(level)
    if handler is None:
        REQUEST_LOG.log(level, "inference", extra={"fields": fields})
        return
    try:  # the line the handler's record would have made, without the record: half of a door answer's log CPU
        handler.write(json_line(time.time(), logging.getLevelName(level), REQUEST_LOG.name, "inference", fields))
    except Exception:  # through logging, whose handler reports what failed (Handler.handleError)
        REQUEST_LOG.log(level, "inference", extra={"fields": fields})


def _sole_handler(level: int) -> _StderrHandler | None:
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
            if found is not None or type(handler) is not _StderrHandler or handler.filters or level < handler.level:
                return None
            found = handler
        logger = logger.parent if logger.propagate else None
    return found
