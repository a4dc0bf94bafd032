"""gunicorn for real (server/gunicorn_conf.py) with its output into a pipe that nobody reads: answers go on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.procs import GUNICORN, REPO_ROOT, free_port, wait_for

pytestmark = pytest.mark.live

REQUESTS = 3000
JUDGE_TIMEOUT_S = 1.0


def _metric(url: str, name: str) -> float:
    """The sum of a series' samples (one per worker where several serve)."""
    text = requests.get(f"{url}/metrics", timeout=JUDGE_TIMEOUT_S).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into += chunk


@contextlib.contextmanager
def _served_into_unread_pipe() -> Iterator[tuple[subprocess.Popen[bytes], str, int]]:
    """gunicorn over the fake app, one worker (as on a 2-core machine), its output into a pipe: (the process, its
    URL, the pipe's read end, left unread)."""
    port = free_port()
    read_end, write_end = os.pipe()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", "FAKE_DELAY_S": "0.001",
           "WEB_WORKERS": "1"}
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "tests.fakes:create_fake_app()"],
        cwd=REPO_ROOT, env=env, stdout=write_end, stderr=subprocess.STDOUT)
    os.close(write_end)  # gunicorn holds its own copy
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: requests.get(f"{url}/readyz", timeout=1).status_code == 200, "gunicorn ready", process)
        yield process, url, read_end
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        os.close(read_end)


def _ask(http: requests.Session, url: str, uuid: str) -> float:
    """One inference request, answered 200 within the judge's timeout (a hang raises): its seconds."""
    body = {"esun_uuid": uuid, "esun_timestamp": 1, "retry": 0,
            "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}
    started = time.monotonic()
    answer = http.post(f"{url}/inference", json=body, timeout=JUDGE_TIMEOUT_S)
    assert answer.status_code == 200
    return time.monotonic() - started


def test_every_request_is_answered_in_time_while_nobody_reads_the_servers_output():
    """Regression (issue 40): under `make run > pipe` with a reader that stopped reading, the 329th request hung, and
    every later one, while /healthz and /readyz answered 200: the worker wrote each request's log line with a
    blocking write(), and the pipe's 64 KiB were full. Now each of 3,000 requests is answered 200 within the judge's
    1 s, the dropped lines are counted, /readyz names the stuck log writer, and when the reader comes back and the
    server stops, every line it wrote is one JSON object, with the count of what was dropped."""
    out = bytearray()
    with _served_into_unread_pipe() as (process, url, read_end), requests.Session() as http:
        slowest = max(_ask(http, url, f"pipe-{i}") for i in range(REQUESTS))
        assert slowest < JUDGE_TIMEOUT_S
        assert _metric(url, "esun_log_lines_dropped_total") > 0
        # Stuck since the pipe filled, some 300 requests in: /readyz says so (LOG_STUCK_AFTER_S, 3 s), /healthz not.
        wait_for(lambda: any("log writer" in reason for reason in requests.get(
            f"{url}/readyz", timeout=JUDGE_TIMEOUT_S).json()["reasons"]), "/readyz naming the log writer",
            timeout_s=5)
        assert requests.get(f"{url}/healthz", timeout=JUDGE_TIMEOUT_S).status_code == 200

        reader = threading.Thread(target=_read_all, args=(read_end, out))  # the reader comes back
        reader.start()
        wait_for(lambda: requests.get(f"{url}/readyz", timeout=1).status_code == 200, "/readyz 200 again", process)
        dropped = _metric(url, "esun_log_lines_dropped_total")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        reader.join(timeout=10)
    lines = [json.loads(line) for line in out.decode("utf-8").splitlines()]  # each one JSON, none cut
    reports = [line for line in lines if line["logger"] == "api.logs"]
    assert reports and sum(line["dropped"] for line in reports) == dropped
    answered = {line["esun_uuid"] for line in lines if line["logger"] == "api.requests"}
    assert len(answered) + dropped >= REQUESTS  # every request's line written or counted dropped
    assert any("Worker exiting" in line["msg"] for line in lines)  # drained at the worker's exit


def test_a_worker_killed_while_nobody_reads_the_servers_output_is_replaced_and_answers():
    """Regression (issue 40): gunicorn's master wrote its own lines ("Worker was sent SIGKILL", and its child's
    "Booting worker") with a blocking write(): with the pipe full, a killed worker was never replaced and nothing
    answered again. Now the master's lines and the new worker's first ones are queued as the workers' are."""
    with _served_into_unread_pipe() as (process, url, _), requests.Session() as http:
        for i in range(600):  # some 200 request lines fill the pipe's 64 KiB
            _ask(http, url, f"fill-{i}")
        wait_for(lambda: any("log writer" in reason for reason in requests.get(
            f"{url}/readyz", timeout=JUDGE_TIMEOUT_S).json()["reasons"]), "the pipe full", timeout_s=5)
        [worker] = psutil.Process(process.pid).children()
        worker.kill()
        wait_for(lambda: [p.pid for p in psutil.Process(process.pid).children()] not in ([], [worker.pid]),
                 "the master booting a worker in the killed one's place", process, timeout_s=20)
        wait_for(lambda: _ask(http, url, "after-kill") < JUDGE_TIMEOUT_S, "an answer from the new worker", process)
        assert max(_ask(http, url, f"after-kill-{i}") for i in range(300)) < JUDGE_TIMEOUT_S
