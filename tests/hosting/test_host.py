"""hosting.host: the model's life behind one contract. The process host swaps through its engine's own method after
the folder's check, a failure changing nothing; every host closes its watcher before its engine; the app closes its
host, then its cache, then its metrics, under gunicorn's worker_exit and `python -m api` alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from api import create_app
from api.state import EXTENSION_KEY
from batching import BatcherError
from config import DEFAULT_WEIGHTS_DIR, Config
from hosting.build import CORRECTOR_TARGET, build_host, process_init_kwargs
from hosting.host import InProcessHost, ProcessHost
from hosting.served import SwapFailed
from tests.fakes import FakeCorrector
from tests.hosting.test_model_swap import build_fake, shipped_copy


class FakeProcessEngine:
    """What ProcessHost asks of the process engine: swap_model and close (each call recorded)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def swap_model(self, init_kwargs: dict[str, Any]) -> None:
        self.calls.append(("swap_model", init_kwargs["kwargs"]["weights_dir"]))
        if self.fail:
            raise BatcherError("a worker process building the new model exited with code 1")

    def close(self, timeout: float = 5.0) -> None:
        self.calls.append(("close", timeout))


def process_host(config: Config, engine: FakeProcessEngine) -> ProcessHost:
    host = ProcessHost(engine, lambda folder: process_init_kwargs(config, CORRECTOR_TARGET, folder))
    host.watch(DEFAULT_WEIGHTS_DIR, DEFAULT_WEIGHTS_DIR, poll_s=0.0)
    return host


def test_process_host_swap_checks_the_folder_then_asks_its_engine_and_says_what_it_serves(config, tmp_path):
    engine = FakeProcessEngine()
    host = process_host(config, engine)

    served = host.swap(shipped_copy(tmp_path / "b"))

    assert engine.calls == [("swap_model", tmp_path / "b")]
    assert served.folder == tmp_path / "b" and served.name
    assert host.describe()["swaps_in"] == "its worker processes, one at a time"


def test_process_host_refuses_a_broken_folder_before_its_engine_is_asked(config, tmp_path):
    engine = FakeProcessEngine()
    (tmp_path / "empty").mkdir()

    with pytest.raises(SwapFailed, match="incomplete"):
        process_host(config, engine).swap(tmp_path / "empty")
    assert engine.calls == []


def test_process_host_turns_an_engine_failure_into_one_line(config, tmp_path):
    with pytest.raises(SwapFailed, match="^BatcherError: a worker process") as failed:
        process_host(config, FakeProcessEngine(fail=True)).swap(shipped_copy(tmp_path / "b"))
    assert "\n" not in str(failed.value)


def test_host_close_stops_the_watcher_before_the_engine(config):
    engine = FakeProcessEngine()
    host = process_host(config, engine)
    assert host.swapper is not None

    host.close(timeout=1.0)

    assert host.swapper._stop.is_set() and engine.calls == [("close", 1.0)]


def test_a_host_around_an_injected_corrector_watches_nothing_and_describes_nothing(config):
    host = build_host(config, lambda report: None, corrector=FakeCorrector())
    try:
        assert isinstance(host, InProcessHost) and host.swapper is None and host.describe() is None
        assert host.trouble() is None and not host.loading()
    finally:
        host.close()


def test_the_app_closes_its_host_then_its_cache_then_its_metrics(config, weights_link, monkeypatch):
    """Issue 62: the close order lived in gunicorn's worker_exit, so `python -m api` never closed the batcher, the
    cache writer or the watcher; both now call AppState.closing."""
    app = create_app(dataclasses.replace(config, weights_dir=weights_link, weights_poll_s=0.0),
                     build_corrector=build_fake)
    state = app.extensions[EXTENSION_KEY]
    closed: list[str] = []
    for name, part in (("host", state.host), ("cache", state.cache), ("metrics", state.metrics)):
        monkeypatch.setattr(part, "close", lambda *a, n=name, f=part.close, **k: (closed.append(n), f(*a, **k)))

    for close in state.closing():
        close()

    assert closed == ["host", "cache", "metrics"]
    assert not state.engine.alive() and state.host.swapper._stop.is_set()


@pytest.fixture
def weights_link(tmp_path: Path) -> Path:
    shipped_copy(tmp_path / "a")
    (tmp_path / "current").symlink_to(tmp_path / "a")
    return tmp_path / "current"
