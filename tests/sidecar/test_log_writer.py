"""sidecar/log_writer.py: the process's log lines reach stderr through one writer thread, never waited for."""

from __future__ import annotations


def _line(i: int) -> str:
    from sidecar.log_writer import json_line

    return json_line(1.0, "INFO", "api.requests", "inference", {"i": i, "pad": "長" * 100})


def _read_all(fd: int, into: bytearray) -> None:
    """Read a pipe until its writers close it (on a thread: the test's reader coming back)."""
    import os

    while chunk := os.read(fd, 65536):
        into += chunk


def test_log_writer_never_blocks_on_a_pipe_nobody_reads_and_counts_every_line_it_drops(monkeypatch):
    """Regression (issue 40): with stderr a pipe nobody read, the 329th request's log line blocked in write() and
    every later request hung. Now `put` returns at once, a full queue drops and counts, the stuck writer is told
    (/readyz's reason), and once the reader is back every line written is whole JSON, with one line that says how
    many were dropped: written + dropped = put."""
    import json
    import os
    import threading
    import time

    from sidecar.log_writer import LogWriter

    read_end, write_end = os.pipe()
    stderr = os.fdopen(write_end, "w")
    monkeypatch.setattr("sys.stderr", stderr)
    writer = LogWriter(capacity=100, stuck_after_s=0.2).start()
    put, slowest, deadline = 0, 0.0, time.monotonic() + 5
    while writer.trouble() is None and time.monotonic() < deadline:  # ~330 bytes a line: the pipe's 64 KiB fill
        for _ in range(100):
            started = time.perf_counter()
            writer.put(_line(put))
            slowest = max(slowest, time.perf_counter() - started)
            put += 1
        time.sleep(0.005)  # the writer's turn
    assert slowest < 0.05
    trouble = writer.trouble()
    assert trouble is not None and "stuck writing to stderr" in trouble and writer.dropped > 0
    assert writer.flush(timeout_s=0.05) is False  # stuck: flush gives up instead of waiting

    out = bytearray()
    reader = threading.Thread(target=_read_all, args=(read_end, out))
    reader.start()
    assert writer.flush(timeout_s=5)
    writer.stop()
    stderr.close()
    reader.join(timeout=5)
    os.close(read_end)
    lines = [json.loads(line) for line in out.decode("utf-8").splitlines()]
    written = [line["i"] for line in lines if "i" in line]
    reports = [line for line in lines if line["logger"] == "api.logs"]
    assert written == sorted(written) and len(written) + writer.dropped == put
    # one line each time a write goes through after drops (the first may come before the pipe filled)
    assert reports and {line["level"] for line in reports} == {"WARNING"}
    assert sum(line["dropped"] for line in reports) == reports[-1]["dropped_total"] == writer.dropped
    assert writer.trouble() is None


def test_log_writer_stop_writes_every_queued_line_then_writes_at_once(tmp_path, monkeypatch):
    """A graceful stop (gunicorn's worker_exit) loses no queued line; lines after it are written on the caller's
    thread, as before the writer started."""
    import json

    from sidecar.log_writer import LogWriter

    path = tmp_path / "stderr.log"
    with open(path, "w", encoding="utf-8") as stderr:
        monkeypatch.setattr("sys.stderr", stderr)
        writer = LogWriter().start()
        for i in range(1000):
            writer.put(_line(i))
        writer.stop()
        writer.put(_line(1000))
    assert [json.loads(line)["i"] for line in path.read_text(encoding="utf-8").splitlines()] == list(range(1001))
    assert writer.dropped == 0
