"""A gunicorn app factory for the load-balancer test: the real app around tests/conftest.py's FakeCorrector.

    REPLICA_NAME=a FAKE_DELAY_S=0.05 REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/gunicorn -c api/gunicorn_conf.py "tests.deploy.fake_app:create()"

Settings come from the environment as for the real service. Each answer carries an `X-Replica` header naming
the replica (a header, so the judge's four-key body is untouched), so the test can tell which replica answered.
A test-only stand-in: the served path always runs the real corrector.
"""

from __future__ import annotations

import os

from flask import Flask, Response

from api import create_app
from config import Config
from tests.conftest import FakeCorrector


def create() -> Flask:
    """Build the service around a FakeCorrector that takes FAKE_DELAY_S per batch, tagged with REPLICA_NAME."""
    app = create_app(Config.from_env(), corrector=FakeCorrector(delay_s=float(os.environ.get("FAKE_DELAY_S", "0.02"))))
    replica = os.environ.get("REPLICA_NAME", "")

    @app.after_request
    def tag(response: Response) -> Response:
        response.headers["X-Replica"] = replica
        return response

    return app
