"""Fixtures for fault, fuzz, overload and shutdown tests: a live server around a `FaultCorrector`, a client
that times each request against the judge's timeout, and the JSON log lines the service wrote."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from config import Config
from sidecar.log_writer import JsonFormatter
from tests.fakes import FaultCorrector
from tests.faults.judge import JudgeClient


@pytest.fixture
def fault_config() -> Config:
    """The judge's default timeout (1 s) with a 0.5 s answer budget: room for a loaded 2-core CI machine."""
    return Config(
        judge_timeout_s=1.0, safety_margin_s=0.5, max_batch_wait_s=0.01, max_batch_size=8,
        http_threads=32, device="cpu", captain_email="captain@example.com", server_uuid_salt="pepper",
    )


@pytest.fixture
def fault_corrector() -> Iterator[FaultCorrector]:
    """A corrector that answers until faults are armed; no hang outlives the test."""
    corrector = FaultCorrector()
    yield corrector
    corrector.release()


@pytest.fixture
def serve(make_app: Callable[..., Flask], make_live_server: Callable[[Flask], str],
          fault_config: Config) -> Callable[..., tuple[Flask, str]]:
    """Build an app with create_app(config, corrector=...) and serve it on loopback; return it and its URL."""

    def start(corrector: Any, config: Config = fault_config, batcher: Any = None) -> tuple[Flask, str]:
        app = make_app(config, corrector, batcher)
        return app, make_live_server(app)

    return start


@pytest.fixture
def judge(fault_config: Config) -> Callable[[str], JudgeClient]:
    """Make a JudgeClient for a base URL, with the config's judge timeout."""
    return lambda base_url: JudgeClient(base_url, fault_config.judge_timeout_s)


@pytest.fixture
def json_log(caplog: pytest.LogCaptureFixture) -> Callable[[], list[dict[str, Any]]]:
    """Return the service's log records so far as the JSON objects its formatter writes (api and batcher)."""
    caplog.set_level(logging.INFO, logger="api")
    caplog.set_level(logging.INFO, logger="batching")
    formatter = JsonFormatter()

    def lines() -> list[dict[str, Any]]:
        return [json.loads(formatter.format(record)) for record in caplog.records
                if record.name.startswith(("api", "batching"))]

    return lines
