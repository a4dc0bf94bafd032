"""gunicorn with the repository's config (server/gunicorn_conf.py): every line it and the app write is JSON, and it
leaves no control socket behind in the user's home."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faults.test_graceful_shutdown import GUNICORN, REPO_ROOT, free_port, wait_until_ready

pytestmark = pytest.mark.live


def _serve(app: str, tmp_path: Path, during: Callable[[int], Any] = lambda _port: None) -> tuple[
        Any, list[dict], int]:
    """Run gunicorn as make run does around `app`, call `during(port)` once it is ready, stop it with SIGTERM;
    return what `during` returned, every line gunicorn and the app wrote (each parsed as JSON), the master's pid."""
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", "HOME": str(tmp_path)}
    env.pop("XDG_RUNTIME_DIR", None)
    process = subprocess.Popen([str(GUNICORN), "-c", "server/gunicorn_conf.py", app], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(port, process)
        result = during(port)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    lines = [json.loads(line) for line in output.decode().splitlines() if line.strip()]  # each one JSON
    return result, lines, process.pid


def test_gunicorn_writes_every_line_as_json_and_no_control_socket(tmp_path: Path):
    """Regression: gunicorn's own lines were plain text beside the app's JSON lines, and gunicorn 27 opened a
    control socket in ~/.gunicorn/ that a second instance took over and deleted on exit."""
    _, lines, master = _serve("tests.fakes:create_slow_app()", tmp_path)
    gunicorn = [line for line in lines if line["logger"] == "gunicorn.error"]
    messages = " | ".join(line["msg"] for line in gunicorn)
    assert "Starting gunicorn" in messages and "Booting worker" in messages and "Shutting down" in messages
    assert {line["pid"] for line in gunicorn} >= {master}
    assert any(line["logger"] == "api.app" for line in lines)
    assert not (tmp_path / ".gunicorn").exists()


def test_gunicorn_writes_a_failing_batch_as_json_lines_too(tmp_path: Path):
    """Regression: the batcher's records (`batching.*`) were not configured: plain text among the JSON lines, INFO
    lost, and an exception would print a bare traceback."""
    body = {"esun_uuid": "fails", "esun_timestamp": 1, "retry": 2, "sentence_list": ["喂 你好"]}
    answer, lines, _ = _serve("tests.fakes:create_failing_app()", tmp_path, lambda port: requests.post(
        f"http://127.0.0.1:{port}/inference", json=body, timeout=2))
    assert answer.status_code == 200 and answer.json()["answer"] == "喂你好"
    failed = [line for line in lines if line["logger"].startswith("batching.")]
    assert failed and "the model failed" in failed[0]["msg"]
