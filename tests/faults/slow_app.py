"""App factories for gunicorn with a slow fake corrector, for the shutdown, boot and restart tests and soak smoke runs.

    FAULT_DELAY_S=0.2 PORT=8099 .venv/bin/gunicorn -c api/gunicorn_conf.py "tests.faults.slow_app:create()"
    LOAD_DELAY_S=3 PORT=8099 .venv/bin/gunicorn -c api/gunicorn_conf.py "tests.faults.slow_app:create_slow_loading()"

Settings come from the environment as for the real service (`Config.from_env()`); `FAULT_DELAY_S` (default
0.05) is the time each batch takes, `LOAD_DELAY_S` (default 3) the time the corrector takes to load, on a thread
as the real one does (api.loading). A test-only stand-in: the served path always runs the real corrector.
"""

from __future__ import annotations

import os
import time

from flask import Flask

from api import create_app
from api.loading import LoadingCorrector
from config import Config
from tests.faults.fault_corrector import FaultCorrector


def create() -> Flask:
    """Build the service around a FaultCorrector that sleeps FAULT_DELAY_S per batch and never faults."""
    delay_s = float(os.environ.get("FAULT_DELAY_S", "0.05"))
    # record=False: a soak run sends this server hundreds of thousands of questions.
    return create_app(Config.from_env(), corrector=FaultCorrector(delay_s=delay_s, record=False))


def create_slow_loading() -> Flask:
    """Build the service around a FaultCorrector that takes LOAD_DELAY_S to load, on a thread."""
    delay_s = float(os.environ.get("FAULT_DELAY_S", "0.05"))
    load_delay_s = float(os.environ.get("LOAD_DELAY_S", "3"))

    def load() -> FaultCorrector:
        time.sleep(load_delay_s)
        return FaultCorrector(delay_s=delay_s, record=False)

    return create_app(Config.from_env(), corrector=LoadingCorrector(load).start())
