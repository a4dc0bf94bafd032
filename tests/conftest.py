"""Shared fixtures: `config`, `app`, `client` (Flask test client) and `live_server` (real HTTP on loopback).

Every app here serves a `FakeCorrector` (tests/fakes.py, where the fakes the tests and the load tools share
live): these tests cover the plumbing (HTTP, the answers without the model, batching, cache), not the model, and
need no weights. The served default is always the real corrector. Only fixtures live here (and the hook that marks
the tests using the live ones `live`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from flask import Flask
from werkzeug.serving import make_server

from api import create_app
from api.state import EXTENSION_KEY
from config import Config
from testing.samples import real_bodies
from tests.fakes import FakeCorrector

# The servers the suite starts (gunicorn, `make run`, the tools) run one worker process unless a test asks for more
# (WEB_WORKERS in its settings): the default, one per core, would double each server's memory and start-up on CI's
# two cores, and most tests read one worker's log and metrics. tests/test_config.py checks the default itself.
os.environ.setdefault("WEB_WORKERS", "1")

# Fixtures that serve over real sockets: a test that uses one is `live` even if it forgets the mark, so that
# `pytest -m "not live"` (the fast local run) never starts a server.
LIVE_FIXTURES = frozenset({"live_server", "make_live_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `live` every test that uses a fixture serving over real sockets."""
    for item in items:
        if LIVE_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("live") is None:
            item.add_marker(pytest.mark.live)


@pytest.fixture
def config() -> Config:
    """Settings for fast tests: a 0.3 s budget and batches that close after 10 ms."""
    return Config(
        judge_timeout_s=0.5, safety_margin_s=0.2, max_batch_wait_s=0.01, max_batch_size=8, http_threads=16,
        device="cpu", captain_email="captain@example.com", server_uuid_salt="pepper",
    )


@pytest.fixture
def corrector() -> FakeCorrector:
    return FakeCorrector()


@pytest.fixture
def fake_corrector() -> type[FakeCorrector]:
    """Give tests the fake's class, to build slow, failing or gated ones."""
    return FakeCorrector


@pytest.fixture
def make_app(config: Config) -> Iterator[Callable[..., Flask]]:
    """Build apps (default: the `config` fixture and a new FakeCorrector); close their engines after."""
    apps: list[Flask] = []

    def make(config: Config = config, corrector: Any = None, engine: Any = None, cache: Any = None) -> Flask:
        app = create_app(config, corrector=corrector or FakeCorrector(), engine=engine, cache=cache)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions[EXTENSION_KEY].engine.close(timeout=2.0)


@pytest.fixture
def app(make_app: Callable[..., Flask], config: Config, corrector: FakeCorrector) -> Flask:
    return make_app(config, corrector)


@pytest.fixture
def client(app: Flask):
    return app.test_client()


@pytest.fixture
def make_live_server() -> Iterator[Callable[[Flask], str]]:
    """Serve apps over real HTTP on free loopback ports (werkzeug, threaded); return their base URLs."""
    servers = []

    def start(app: Flask) -> str:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name="live-server", daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


@pytest.fixture
def live_server(make_live_server: Callable[[Flask], str], app: Flask) -> str:
    """Serve the `app` fixture over HTTP; return its base URL."""
    return make_live_server(app)


@pytest.fixture
def http() -> Iterator[requests.Session]:
    """An HTTP client that ignores proxy settings from the environment (the server is on loopback)."""
    with requests.Session() as session:
        session.trust_env = False
        yield session


@pytest.fixture
def real_requests() -> list[dict[str, Any]]:
    """The five real request bodies of the competition (testing/data/real_requests.jsonl)."""
    return real_bodies()


@pytest.fixture
def request_paths(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """Read the `path` of every inference request logged so far."""
    caplog.set_level(logging.INFO, logger="api")

    def paths() -> list[str]:
        return [r.fields["path"] for r in caplog.records if r.name == "api.requests"]

    return paths


@pytest.fixture
def make_body() -> Callable[..., dict[str, Any]]:
    """Build a request body like the judge's; keyword arguments replace its fields."""

    def make(sentences: list[str] | None = None, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "esun_uuid": "6465e4f10a0b099c44791e901efb7e8d9268b972b95b6fa53db93780b6b22fbf",
            "esun_timestamp": 1590493849,
            "sentence_list": sentences or ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"],
            "phoneme_sequence_list": ["w eI4 n i:3 x aU4 m i:4 m A:3 w O:3 j aU1 ts6 j ax n4 ts6_h y4"],
            "retry": 2,
        }
        body.update(fields)
        return body

    return make
