"""gunicorn for real (server/gunicorn_conf.py): a server started on a port another one listens on stops at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from tests.deploy.procs import GUNICORN, REPO_ROOT

pytestmark = pytest.mark.live


def test_a_second_server_on_a_taken_port_stops_in_one_json_line_without_retrying():
    """Regression: a second `make run` spent 11 s on gunicorn's five tries a second apart, ten error lines."""
    with socket.socket() as first:
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        run = subprocess.run(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "tests.fakes:create_fake_app()"],
            cwd=REPO_ROOT, env={**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO"},
            capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    lines = [json.loads(text) for text in run.stderr.splitlines()]  # every line JSON, as gunicorn's own
    errors = [line["msg"] for line in lines if line["level"] == "ERROR"]
    assert errors == [f"port {port} is in use on 127.0.0.1: another server listens there (a second make run?); "
                      "stop it or set PORT to another port"]
    assert not any("Connection in use" in line["msg"] for line in lines)  # gunicorn never tried to bind it


def test_a_failed_start_leaves_no_shared_folder_and_warns_of_a_misspelled_setting(tmp_path):
    """Issue 62: a start that failed (the port in use) left an empty /tmp/esun-shared-* folder behind, and
    `MAX_BATCH_SIZ=8` was silently ignored."""
    with socket.socket() as first:
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        run = subprocess.run(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "tests.fakes:create_fake_app()"],
            cwd=REPO_ROOT, env={**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "WEB_WORKERS": "2",
                                "TMPDIR": str(tmp_path), "MAX_BATCH_SIZ": "8"},
            capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert list(tmp_path.glob("esun-shared-*")) == []
    warnings = [line["msg"] for line in map(json.loads, run.stderr.splitlines()) if line["level"] == "WARNING"]
    assert warnings.count("MAX_BATCH_SIZ is not a setting (ignored): did you mean MAX_BATCH_SIZE?") == 1
