"""sidecar.lifecycle: one start and one stop per process; sidecar.shared_dir: the master's folder for its workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import lifecycle, log_writer
from sidecar.log_writer import LogWriter
from sidecar.shared_dir import make_shared_dir, remove_shared_dir


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> LogWriter:
    fresh = LogWriter()
    monkeypatch.setattr(lifecycle, "LOG_WRITER", fresh)
    monkeypatch.setattr(log_writer, "LOG_WRITER", fresh)
    return fresh


def test_start_runs_the_log_writer_thread_and_stop_ends_it(writer: LogWriter) -> None:
    lifecycle.start()
    assert writer._thread is not None and writer._thread.is_alive()
    lifecycle.stop()
    assert writer._thread is None


def test_stop_closes_in_order_removes_the_shared_folder_then_stops_the_log_writer(writer: LogWriter) -> None:
    closed: list[str] = []
    folder = Path(make_shared_dir())
    (folder / "metrics").mkdir()
    lifecycle.start()
    lifecycle.stop(lambda: closed.append("engine"), lambda: closed.append("cache"), shared_dir=str(folder))
    assert closed == ["engine", "cache"]
    assert not folder.exists()
    assert writer._thread is None


def test_a_closer_that_raises_still_stops_the_log_writer_and_propagates(writer: LogWriter) -> None:
    closed: list[str] = []

    def fails() -> None:
        raise RuntimeError("the batcher would not stop")

    lifecycle.start()
    with pytest.raises(RuntimeError, match="would not stop"):
        lifecycle.stop(fails, lambda: closed.append("cache"))
    assert closed == []  # as the worker's exit always did: the first failure ends the closing
    assert writer._thread is None


def test_the_shared_folder_is_made_fresh_and_removing_it_twice_is_harmless() -> None:
    first, second = make_shared_dir(), make_shared_dir()
    assert first != second and Path(first).is_dir() and Path(first).name.startswith("esun-shared-")
    remove_shared_dir(first)
    remove_shared_dir(first)
    remove_shared_dir(second)
    assert not Path(first).exists() and not Path(second).exists()
