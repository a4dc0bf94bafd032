"""A gunicorn app factory that serves tests/conftest.py's FakeCorrector, for when model/weights/ is empty.

`gunicorn -c api/gunicorn_conf.py "tests.clients.fake_app:create_fake_app()"`: the same server, settings and
routes as `make run`, with the fake in place of the shipped model. Only the client tests use it, and only when
asked to (CLIENT_TESTS_SERVER=fake, see conftest.py): the served default is always the real corrector.
"""

from __future__ import annotations

import os

from flask import Flask

from api import create_app
from config import Config
from tests.conftest import FakeCorrector


def create_fake_app() -> Flask:
    """Build the app from the environment's settings around a FakeCorrector (FAKE_DELAY_S per batch)."""
    delay_s = float(os.environ.get("FAKE_DELAY_S", "0.005"))
    return create_app(Config.from_env(), corrector=FakeCorrector(delay_s=delay_s))
