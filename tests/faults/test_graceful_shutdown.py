"""gunicorn for real (server/gunicorn_conf.py, one gthread worker), stopped with SIGTERM in the middle of load.

The clients open a new connection per request, as the judge's sender does, and tell apart:

- `refused`: connect() failed, the listener was closed: the request never reached the server (fine);
- `broken`: the connection was made, then reset, closed or left unanswered: an accepted request lost (a bug).

Which requests were in flight when SIGTERM landed is read from the server's own request log (accepted before it,
answered after it), never from when the client tried: a connect begun just before SIGTERM and refused just after
was never the server's (issue 40: such an attempt, counted as in flight, failed the test once in a fresh clone).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.live

REPO_ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).parent / "gunicorn"
BATCH_DELAY_S = 0.3  # long enough that requests are surely in flight when SIGTERM lands
CLIENTS = 12
CLIENT_TIMEOUT_S = 5.0  # far above the answer budget: a request left hanging shows up as broken, not slow
GRACEFUL_TIMEOUT_S = 10
LOG_NAME = "gunicorn.log"  # the server's output, in the test's tmp_path
CLOSE_RACE_S = 0.1  # how near the first refused connect a reset counts as the listener's close race
MAX_RACED = 2  # of CLIENTS: a reset at the close is a client that happened to connect in that instant


@dataclass(frozen=True)
class Attempt:
    """One request as its client saw it."""

    esun_uuid: str
    started: float
    ended: float
    outcome: str  # "200", another status, "refused" or "broken: <error>"


@dataclass(frozen=True)
class Served:
    """One request as the server's log tells it: when its worker accepted it and when it was answered (wall clock)."""

    esun_uuid: str
    accepted_at: float
    answered_at: float


def served_requests(log: str) -> list[Served]:
    """Read the server's request log lines (logger api.requests): `ts` is when the answer was logged, `latency_ms`
    counts from the request's accept stamp (api/accept.py)."""
    out = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if record.get("logger") == "api.requests":
            answered_at = float(record["ts"])
            out.append(Served(record["esun_uuid"], answered_at - record["latency_ms"] / 1000, answered_at))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def gunicorn_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Start gunicorn with the repository's config around a slow fake corrector; kill it if a test left it.

    Its output goes to tmp_path's LOG_NAME, never to a pipe nobody reads while it runs: once the shed answers'
    WARNING lines filled a pipe's 64 KiB, the worker blocked writing them and every request hung (a flaky failure)."""
    port = free_port()
    env = {
        **os.environ, "HOST": "127.0.0.1", "PORT": str(port), "HTTP_THREADS": "32", "MAX_BATCH_SIZE": "8",
        "GRACEFUL_TIMEOUT_S": str(GRACEFUL_TIMEOUT_S), "FAULT_DELAY_S": str(BATCH_DELAY_S), "LOG_LEVEL": "INFO",
    }
    with (tmp_path / LOG_NAME).open("wb") as log:  # gunicorn holds its own copy of the descriptor
        process = subprocess.Popen(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "tests.fakes:create_slow_app()"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_until_ready(port, process, tmp_path / LOG_NAME)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)


def wait_until_ready(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"gunicorn exited early: {log.read_text()[-2000:]}"
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("gunicorn did not become ready")


def send_once(port: int, body: bytes) -> str:
    """POST one question on a fresh connection; say how it ended."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    connection.sock = sock
    try:
        connection.request("POST", "/inference", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return str(response.status)
    except (OSError, http.client.HTTPException) as exc:
        return f"broken: {type(exc).__name__}: {exc}"
    finally:
        connection.close()


def client_loop(port: int, index: int, stop: threading.Event, attempts: list[Attempt]) -> None:
    number = 0
    while not stop.is_set():
        esun_uuid = f"shutdown-{index}-{number}"
        body = {"esun_uuid": esun_uuid, "esun_timestamp": time.time(),
                "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"], "retry": 2}
        started = time.monotonic()
        outcome = send_once(port, json.dumps(body).encode())
        attempts.append(Attempt(esun_uuid, started, time.monotonic(), outcome))
        number += 1
        if outcome == "refused":
            time.sleep(0.01)


def test_gunicorn_sigterm_finishes_requests_in_flight_and_exits_0(
    gunicorn_server: tuple[subprocess.Popen[bytes], int], tmp_path: Path,
) -> None:
    """Regression: gthread's stopping worker kept its listening socket open while it drained, so connections
    made after SIGTERM were completed by the kernel, never accepted, and reset when the worker exited: those
    clients waited the whole drain and then saw "connection reset" instead of an immediate "refused"
    (fixed by server/gunicorn_conf.py's post_worker_init)."""
    process, port = gunicorn_server
    stop = threading.Event()
    attempts: list[Attempt] = []
    clients = [threading.Thread(target=client_loop, args=(port, i, stop, attempts), daemon=True)
               for i in range(CLIENTS)]
    for thread in clients:
        thread.start()
    time.sleep(1.0)

    sigterm_at, sigterm_wall = time.monotonic(), time.time()
    process.send_signal(signal.SIGTERM)
    exit_code = process.wait(timeout=GRACEFUL_TIMEOUT_S + 5)
    exited_at = time.monotonic()
    time.sleep(0.3)  # the clients meet the closed listener
    stop.set()
    for thread in clients:
        thread.join(timeout=CLIENT_TIMEOUT_S + 1)
    log = (tmp_path / LOG_NAME).read_text(errors="replace")

    assert exit_code == 0, log[-3000:]
    outcomes = {a.esun_uuid: a.outcome for a in attempts}
    served = served_requests(log)
    broken = [a for a in attempts if a.outcome not in ("200", "refused")]
    # The one race no server closing a listener escapes: a connect the kernel completes in the instant between the
    # worker's last look at its queue and its close (a GIL switch on a busy machine) is reset, never the server's.
    # It hits at most a couple of clients, at the moment connects start being refused; the bug this test guards
    # against reset every client that connected during the drain, when the worker exited.
    first_refused = min((a.started for a in attempts if a.outcome == "refused"), default=math.inf)
    raced = [a for a in broken if abs(a.ended - first_refused) <= CLOSE_RACE_S and a.esun_uuid not in
             {s.esun_uuid for s in served}]
    assert len(raced) <= MAX_RACED and broken == raced, f"accepted requests not answered 200: {broken[:5]}"
    in_flight_at_sigterm = [s for s in served if s.accepted_at < sigterm_wall < s.answered_at]
    assert in_flight_at_sigterm, "no request was in flight when SIGTERM landed: the test proves nothing"
    assert [outcomes.get(s.esun_uuid) for s in in_flight_at_sigterm] == ["200"] * len(in_flight_at_sigterm)
    # Every request the server accepted was answered to its client, before SIGTERM or after.
    unanswered = [s for s in served if outcomes.get(s.esun_uuid) != "200"]
    assert not unanswered, f"accepted by the server, not answered 200 to its client: {unanswered[:5]}"
    assert any(a.outcome == "refused" for a in attempts), "the listener was never seen closed"
    # Draining takes about one batch, far inside the graceful timeout.
    assert exited_at - sigterm_at < GRACEFUL_TIMEOUT_S / 2
    assert "Traceback" not in log, log[-3000:]
