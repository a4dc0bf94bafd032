"""gunicorn for real (server/gunicorn_conf.py) with its output into a pipe that nobody reads: answers go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

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


def test_every_request_is_answered_in_time_while_nobody_reads_the_servers_output():
    """Regression (issue 40): under `make run > pipe` with a reader that stopped reading, the 329th request hung, and
    every later one, while /healthz and /readyz answered 200: the worker wrote each request's log line with a
    blocking write(), and the pipe's 64 KiB were full. Now each of 3,000 requests is answered 200 within the judge's
    1 s, the dropped lines are counted, /readyz names the stuck log writer, and when the reader comes back and the
    server stops, every line it wrote is one JSON object, with the count of what was dropped."""
    port, url = free_port(), ""
    read_end, write_end = os.pipe()
    # One worker (as on a 2-core machine): the /readyz asked is the one whose writer is stuck.
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", "FAKE_DELAY_S": "0.001",
           "WEB_WORKERS": "1"}
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "tests.fakes:create_fake_app()"],
        cwd=REPO_ROOT, env=env, stdout=write_end, stderr=subprocess.STDOUT)
    os.close(write_end)  # gunicorn holds its own copy; read_end stays open and unread until the end
    out = bytearray()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: requests.get(f"{url}/readyz", timeout=1).status_code == 200, "gunicorn ready", process)
        slowest, statuses = 0.0, set()
        with requests.Session() as http:
            for i in range(REQUESTS):
                body = {"esun_uuid": f"pipe-{i}", "esun_timestamp": 1, "retry": 0,
                        "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}
                started = time.monotonic()
                answer = http.post(f"{url}/inference", json=body, timeout=JUDGE_TIMEOUT_S)  # a hang raises here
                slowest = max(slowest, time.monotonic() - started)
                statuses.add(answer.status_code)
        assert statuses == {200} and slowest < JUDGE_TIMEOUT_S
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
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        os.close(read_end)
    lines = [json.loads(line) for line in out.decode("utf-8").splitlines()]  # each one JSON, none cut
    reports = [line for line in lines if line["logger"] == "api.logs"]
    assert reports and sum(line["dropped"] for line in reports) == dropped
    answered = {line["esun_uuid"] for line in lines if line["logger"] == "api.requests"}
    assert len(answered) + dropped >= REQUESTS  # every request's line written or counted dropped
    assert any("Worker exiting" in line["msg"] for line in lines)  # drained at the worker's exit
