"""gunicorn for real while the model loads (hosting.loading): at boot, and when a worker is SIGKILLed under load.

The app is tests/fakes.py's `create_slow_loading_app()`: a fake corrector that takes LOAD_DELAY_S to load
on a thread, as the real one does. Regression for both tests: the model was loaded before the worker served,
so /healthz hung for the whole load, and a worker that replaced a dead one left every question waiting (past the
judge's timeout) until its model was loaded.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from tests.fakes import FaultCorrector
from tests.faults.test_graceful_shutdown import GUNICORN, REPO_ROOT, free_port

pytestmark = pytest.mark.live

LOAD_DELAY_S = 3.0
HEALTHZ_WITHIN_S = 0.1  # from the moment the port accepts connections
JUDGE_TIMEOUT_S = 1.0
CLIENTS = 10
TOP1 = "喂你好密碼我要進去"


@dataclass(frozen=True)
class Attempt:
    """One request as its client saw it: when it started and ended, its status ("broken: ..." without one)."""

    started: float
    ended: float
    status: str
    answer: str = ""


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    port: int
    opened_at: float  # time.monotonic() when the port first accepted a connection


@pytest.fixture
def slow_loading_server() -> Iterator[Server]:
    """Start gunicorn around the slow-loading fake; return as soon as its port accepts connections."""
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "HTTP_THREADS": "32", "MAX_BATCH_SIZE": "8",
           "JUDGE_TIMEOUT_S": str(JUDGE_TIMEOUT_S), "LOAD_DELAY_S": str(LOAD_DELAY_S), "FAULT_DELAY_S": "0.02",
           "LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket",
         "tests.fakes:create_slow_loading_app()"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield Server(process, port, wait_for_port(port, process))
    finally:
        process.kill()
        process.wait(timeout=5)


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "gunicorn exited early"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return time.monotonic()
        except OSError:
            time.sleep(0.002)
    raise AssertionError("gunicorn never opened its port")


def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def question(name: str) -> dict:
    return {"esun_uuid": name, "esun_timestamp": time.time(), "retry": 2,
            "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}


def wait_until_ready(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while request(port, "GET", "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "the model never finished loading"
        time.sleep(0.05)


def test_gunicorn_answers_healthz_and_top1_while_the_model_loads(slow_loading_server: Server):
    server = slow_loading_server
    status, _ = request(server.port, "GET", "/healthz")
    healthz_s = time.monotonic() - server.opened_at
    assert status == 200
    assert healthz_s < HEALTHZ_WITHIN_S, f"/healthz took {healthz_s * 1000:.0f} ms from the port's opening"

    status, ready = request(server.port, "GET", "/readyz")
    assert status == 503
    assert ready["reasons"][0].startswith("model is loading")

    started = time.monotonic()
    status, data = request(server.port, "POST", "/inference", question("while-loading"))
    assert (status, data["answer"]) == (200, TOP1)
    assert time.monotonic() - started < JUDGE_TIMEOUT_S / 4  # at once, not at the deadline
    assert time.monotonic() - server.opened_at < LOAD_DELAY_S  # all of it while the model was loading

    wait_until_ready(server.port, timeout_s=LOAD_DELAY_S + 10)
    status, data = request(server.port, "POST", "/inference", question("loaded"))
    assert (status, data["answer"]) == (200, FaultCorrector.MARK + TOP1)


def client_loop(port: int, index: int, stop: threading.Event, attempts: list[Attempt]) -> None:
    """Ask questions one after the other, each on a new connection, as the judge's sender does."""
    number = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            status, data = request(port, "POST", "/inference", question(f"restart-{index}-{number}"))
            attempt = Attempt(started, time.monotonic(), str(status), data.get("answer", ""))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            attempt = Attempt(started, time.monotonic(), f"broken: {type(exc).__name__}: {exc}")
        attempts.append(attempt)
        number += 1


def test_gunicorn_answers_in_time_while_a_replaced_worker_loads_the_model(slow_loading_server: Server):
    server = slow_loading_server
    wait_until_ready(server.port, timeout_s=LOAD_DELAY_S + 10)
    stop = threading.Event()
    attempts: list[Attempt] = []
    clients = [threading.Thread(target=client_loop, args=(server.port, i, stop, attempts), daemon=True)
               for i in range(CLIENTS)]
    for thread in clients:
        thread.start()
    time.sleep(0.5)

    [worker] = psutil.Process(server.process.pid).children()
    killed_at = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)  # as the kernel's OOM killer would
    time.sleep(LOAD_DELAY_S + 1.0)
    stop.set()
    for thread in clients:
        thread.join(timeout=10)

    after = [a for a in attempts if a.started > killed_at]
    late = [a for a in after if a.status != "200" or a.ended - a.started >= JUDGE_TIMEOUT_S]
    assert not late, f"{len(late)} of {len(after)} questions asked after the kill failed or came late: {late[:3]}"
    # Only questions in the dead worker's hands when it died may be lost: at most one per client.
    cut = [a for a in attempts if a.status != "200"]
    assert len(cut) <= CLIENTS and all(a.started < killed_at for a in cut)
    answers = [a.answer for a in after]
    assert TOP1 in answers, "no TOP1 answer while the new worker loaded the model: the test proves nothing"
    assert answers[-1] == FaultCorrector.MARK + TOP1 or FaultCorrector.MARK + TOP1 in answers[-CLIENTS:]
    assert psutil.Process(server.process.pid).children()[0].pid != worker.pid
