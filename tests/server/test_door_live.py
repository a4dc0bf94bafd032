"""gunicorn for real (server.worker, api.answers): with the pool full, the event loop answers a question at once.

The app is tests/fakes.py's slow app: its corrector takes FAULT_DELAY_S per batch, past the budget, so each
question holds its thread until its deadline (TOP1, path `deadline`). POOL_CAP such questions fill the pool;
another question is then answered by the worker's event loop within milliseconds (TOP1, path `pool_full`), on a
connection that stays open for the next request, while the threads beyond the limit still serve /healthz.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.procs import LiveServer, free_port, gunicorn

pytestmark = pytest.mark.live

THREADS = 8
POOL_CAP = THREADS // 2  # the pool holds half the threads
BUDGET_S = 0.75  # JUDGE_TIMEOUT_S 1.0 less the default 0.25 margin
TOP1 = "喂你好密碼我要進去"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("gunicorn") / "stderr.jsonl"
    settings = {"HTTP_THREADS": str(THREADS), "MAX_BATCH_SIZE": "2",
                "JUDGE_TIMEOUT_S": "1.0", "FAULT_DELAY_S": "2",
                "OVERLOAD_TARGET_S": "0"}  # the overload control off: only a full pool sends a question to the door
    with gunicorn("tests.fakes:create_slow_app()", port, log, settings):
        yield LiveServer(port, log)


def request(name: str, close: bool = False) -> bytes:
    body = json.dumps({"esun_uuid": name, "esun_timestamp": 1590493849, "retry": 2,
                       "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}).encode()
    head = (f"POST /inference HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n")
    return head.encode() + body


def read_answer(sock: socket.socket, buffered: bytearray) -> tuple[int, dict[str, str], dict]:
    """Read one Content-Length response from `sock` (bytes past it stay in `buffered`)."""
    while b"\r\n\r\n" not in buffered:
        buffered += _recv(sock)
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (f.partition(":") for f in fields)}
    length = int(headers["content-length"])
    while len(rest) < length:
        rest += _recv(sock)
    buffered[:] = rest[length:]
    return int(status_line.split()[1]), headers, json.loads(rest[:length])


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("closed by the server")
    return chunk


def paths(log: Path, esun_uuid: str, wait_s: float = 5.0) -> list[str]:
    """The paths the server logged for this question, waiting up to `wait_s` for a first line: the worker's log lines
    reach the file from a writer thread a moment after the answer leaves (sidecar/log_writer.py)."""
    until = time.monotonic() + wait_s
    while True:
        lines = [json.loads(t) for t in log.read_text(encoding="utf-8").splitlines() if t.startswith("{")]
        found = [line["path"] for line in lines
                 if line.get("msg") == "inference" and line.get("esun_uuid") == esun_uuid]
        if found or time.monotonic() >= until:
            return found
        time.sleep(0.02)


def _wait_until_no_question_is_on_the_model(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        connection.close()
        if "\nesun_overload_model_in_flight 0.0\n" in text:
            return
        time.sleep(0.05)
    raise AssertionError("questions stayed on the model")


class BusyThreads:
    """POOL_CAP questions that each hold a thread until their deadline, asked on their own connections."""

    def __init__(self, port: int, tag: str) -> None:
        _wait_until_no_question_is_on_the_model(port)  # an earlier test's batch may still run
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(POOL_CAP)]
        for i, sock in enumerate(self.socks):
            sock.sendall(request(f"{tag}-busy-{i}"))
        time.sleep(0.2)  # each reaches its thread and waits on the model

    def finish(self) -> list[int]:
        statuses = [read_answer(sock, bytearray())[0] for sock in self.socks]
        for sock in self.socks:
            sock.close()
        return statuses


def test_with_the_pool_full_a_question_is_answered_at_once_and_the_connection_kept(server: LiveServer):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        busy = BusyThreads(server.port, "kept")
        started = time.monotonic()
        sock.sendall(request("at-the-door"))
        status, headers, body = read_answer(sock, buffered := bytearray())
        took_s = time.monotonic() - started
        assert busy.finish() == [200] * POOL_CAP
        # The same connection serves the next question, now by a thread (no thread is busy any more).
        sock.sendall(request("after-the-door"))
        assert read_answer(sock, buffered)[0] == 200
    assert (status, body["answer"], body["esun_uuid"]) == (200, TOP1, "at-the-door")
    assert set(body) == {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
    assert headers["connection"] == "keep-alive" and headers["content-type"] == "application/json"
    assert took_s < BUDGET_S / 3  # not from a thread, which would come at a busy question's deadline
    assert paths(server.log, "at-the-door") == ["pool_full"]
    assert paths(server.log, "after-the-door") == ["deadline"]


def test_questions_pipelined_behind_one_another_are_all_answered_at_the_door_in_order(server: LiveServer):
    # Regression: each pipelined question answered at the door nested a call for the next; 600 hit the recursion
    # limit and the connection was reset after 242 answers.
    names = [f"pipelined-{i}" for i in range(600)]
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        busy = BusyThreads(server.port, "pipelined")
        sender = threading.Thread(target=sock.sendall, args=(b"".join(request(name) for name in names),))
        sender.start()  # while the answers are read: the client's buffers would fill otherwise
        buffered = bytearray()
        answers = [read_answer(sock, buffered)[2]["esun_uuid"] for _ in names]
        sender.join()
        busy.finish()
    assert answers == names
    assert [paths(server.log, name) for name in names[:3]] == [["pool_full"]] * 3


def test_a_question_asking_to_close_is_answered_at_the_door_then_the_connection_closed(server: LiveServer):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        busy = BusyThreads(server.port, "close")
        sock.sendall(request("closing", close=True))
        status, headers, body = read_answer(sock, buffered := bytearray())
        assert sock.recv(1) == b"" and not buffered  # the server closed after the answer
        busy.finish()
    assert (status, headers["connection"], body["answer"]) == (200, "close", TOP1)


def test_threads_beyond_the_pool_cap_still_serve_health_probes(server: LiveServer):
    busy = BusyThreads(server.port, "probe")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BUDGET_S / 3)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200  # by a thread, without waiting for a busy one
        connection.close()
    finally:
        busy.finish()


def test_an_unreadable_body_with_the_pool_full_still_gets_the_views_400(server: LiveServer):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        busy = BusyThreads(server.port, "bad")
        body = b'{"esun_uuid": "bad"}'
        sock.sendall(b"POST /inference HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        done = threading.Event()
        status: list[int] = []

        def read() -> None:
            status.append(read_answer(sock, bytearray())[0])
            done.set()

        threading.Thread(target=read, daemon=True).start()
        busy.finish()
        assert done.wait(5)
    assert status == [400]
