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
from typing import Any

from api.paths import AnswerPath

REQUEST_LOG = logging.getLogger("api.requests")


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object, with the fields passed in `extra={"fields": ...}` (and its `pid`)."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.with_pid:
            line["pid"] = record.process
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            # Tracebacks go to the log, never to the client.
            line["exc"] = self.formatException(record.exc_info)
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
            line = self.format(record) + "\n"
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
        except Exception:
            self.handleError(record)


# The project's own packages log at the configured level; everything else (libraries) at WARNING and above.
OWN_PACKAGES = ("api", "batching", "cache", "model", "preprocess", "config")


def configure_logging(level: str) -> None:
    """Send every record to stderr as one JSON line, through one handler on the root logger (safe to call again):
    the project's packages at `level`, other packages' at WARNING and above, so nothing reaches stderr as plain
    text (a batcher's dead worker, a library's warning) and no warning is lost."""
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
    REQUEST_LOG.log(level, "inference", extra={"fields": fields})
