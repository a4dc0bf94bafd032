"""gunicorn with the repository's config (server/gunicorn_conf.py): every line it and the app write is JSON, and it
leaves no control socket behind in the user's home."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.faults.test_graceful_shutdown import GUNICORN, REPO_ROOT, free_port, wait_until_ready

pytestmark = pytest.mark.live


def _serve(app: str, tmp_path: Path, during: Callable[[int], Any] = lambda _port: None,
           settings: dict[str, str] | None = None, ready_timeout_s: float = 20.0) -> tuple[Any, list[dict], int]:
    """Run gunicorn as make run does around `app`, call `during(port)` once it is ready, stop it with SIGTERM;
    return what `during` returned, every line gunicorn and the app wrote (each parsed as JSON), the master's pid."""
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", "HOME": str(tmp_path),
           **(settings or {})}
    env.pop("XDG_RUNTIME_DIR", None)
    log = tmp_path / "gunicorn.log"  # a file, not a pipe read only at the end: a full pipe would block the server
    with log.open("wb") as out:  # gunicorn holds its own copy of the descriptor
        process = subprocess.Popen([str(GUNICORN), "-c", "server/gunicorn_conf.py", app], cwd=REPO_ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(port, process, log, ready_timeout_s)
        result = during(port)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # each one JSON
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


def _model_processes() -> list[psutil.Process]:
    """The process engine's model processes under this test's gunicorn (spawned: their command line says so)."""
    return [p for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def _load_and_kill(port: int) -> list[tuple[float, int, str]]:
    """Post a question every 50 ms; 3 s in, kill one model process (SIGKILL, as the OOM killer does); go on until
    the new set has answered with the model for 2 s. Return (seconds after the kill, status, esun_uuid) of each."""
    url, sent, killed_at = f"http://127.0.0.1:{port}", [], None
    with requests.Session() as http:
        started = time.monotonic()
        for i in range(2000):
            body = {"esun_uuid": f"kill-{i}", "retry": 2, "sentence_list": ["今天 天氣 很好", "今天 天器 很好"]}
            answer = http.post(f"{url}/inference", json=body, timeout=10)
            now = time.monotonic()
            sent.append((now - (killed_at or now), answer.status_code, body["esun_uuid"]))
            if killed_at is None and now - started > 3:
                victims = _model_processes()
                assert len(victims) == 2, victims
                victims[0].send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
            if killed_at is not None and now - killed_at > 2 and http.get(f"{url}/readyz", timeout=10).ok:
                recovered = [t for t, *_ in sent if t > 0]
                if recovered and recovered[-1] - recovered[0] > 2:
                    break
            time.sleep(0.05)
    return sent


@pytest.mark.real_model
def test_with_a_model_process_killed_under_load_every_line_is_json_and_no_question_waits_out_its_budget(tmp_path):
    """Issue 31: with BATCHER_WORKERS=2 a killed model process's set is replaced; every line on stderr (the model's
    load in each process included, transformers' warnings too) is JSON, and while no model can answer, questions
    answer TOP1 at once (model_loading), never after their budget (deadline)."""
    sent, lines, _ = _serve("api:create_app()", tmp_path, _load_and_kill, {"BATCHER_WORKERS": "2"},
                            ready_timeout_s=120)
    assert {status for _, status, _ in sent} == {200}
    paths = {line["esun_uuid"]: line["path"] for line in lines if line["logger"] == "api.requests"}
    after_kill = [paths[uuid] for t, _, uuid in sent if t > 0]
    assert "model_loading" in after_kill and after_kill[-1] == "model", after_kill
    assert "deadline" not in paths.values(), sorted(set(paths.values()))
    assert not [line for line in lines if line["logger"] == "api.admission"]  # the overload control never flapped
    assert any("exited with code -9" in line["msg"] for line in lines if line["logger"].startswith("batching."))
