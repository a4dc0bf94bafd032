"""Fixtures of the client tests: a served service (`served`) and the tools that drive it (JMeter, newman).

`served` is gunicorn with the shipped corrector, started as `make run` starts it, on a free loopback port, once
per session. With CLIENT_TESTS_SERVER=fake it serves tests/fakes.py's FakeCorrector instead (for a checkout
without model/weights/); nothing falls back to the fake on its own. A missing tool or missing weights fail the
test with what to run, never skip it: `make test` installs the tools first (testing/install_tools.sh).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.server import APP, REPO_ROOT, ServerProcess, missing_weights, start_server

SERVER_MODE_ENV = "CLIENT_TESTS_SERVER"
FAKE_APP = "tests.fakes:create_fake_app()"
TESTING_DIR = REPO_ROOT / "testing"
INSTALL_HINT = "run `bash testing/install_tools.sh` (make test runs it before the tests)"


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Serve the app with gunicorn on loopback for the whole session; its log is in server.log_path."""
    mode = os.environ.get(SERVER_MODE_ENV, "real")
    if mode not in ("real", "fake"):
        pytest.fail(f"{SERVER_MODE_ENV} must be real or fake, got {mode!r}")
    if mode == "real" and (missing := missing_weights()):
        pytest.fail(
            f"model/weights/ lacks {', '.join(missing)}: the client tests serve the shipped corrector with gunicorn "
            f"as `make run` does. Train it (`make train`), or run them against a FakeCorrector with "
            f"{SERVER_MODE_ENV}=fake."
        )
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    server = start_server({"LOG_LEVEL": "INFO"}, log_path, app=APP if mode == "real" else FAKE_APP)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def jmeter_run_sh() -> Path:
    """Return testing/jmeter/run.sh once JMeter 2.13, its HTTP sampler and the XStream fix are installed."""
    if shutil.which("jmeter") is None:
        pytest.fail(f"jmeter is not installed: {INSTALL_HINT}")
    if not Path("/usr/share/jmeter/lib/ext/ApacheJMeter_http.jar").is_file():
        pytest.fail(f"JMeter's HTTP sampler (Debian package jmeter-http) is not installed: {INSTALL_HINT}")
    build = TESTING_DIR / "jmeter" / "build"
    if not (build / "allow-jmeter-types.jar").is_file() or not (build / "saveservice.properties").is_file():
        pytest.fail(f"JMeter's XStream fix is not built in {build}: {INSTALL_HINT}")
    return TESTING_DIR / "jmeter" / "run.sh"


@pytest.fixture(scope="session")
def newman() -> Path:
    """Return the newman installed in testing/postman/node_modules."""
    if shutil.which("node") is None:
        pytest.fail(f"node is not installed (newman needs it): {INSTALL_HINT}")
    path = TESTING_DIR / "postman" / "node_modules" / ".bin" / "newman"
    if not path.exists():
        pytest.fail(f"newman is not installed in {path.parent}: {INSTALL_HINT}")
    return path
