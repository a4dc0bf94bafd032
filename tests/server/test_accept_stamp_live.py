"""gunicorn for real (server/gunicorn_conf.py, server.worker's ReadingThreadWorker): the accept stamp reaches the view.

The app is tests/fakes.py's fake-corrector app (answers MARK + TOP1 within milliseconds). A request's clock
starts at its first byte: a client that connects, then waits past the whole budget before sending its request, gets
the model's answer, and the log's latency is the client's; a kept-alive connection that idles as long is stamped
when its next request arrives, so that request goes to the model too.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.procs import LiveServer, free_port, gunicorn, wait_for

pytestmark = pytest.mark.live

BUDGET_S = 0.75  # JUDGE_TIMEOUT_S 1.0 less the default 0.25 margin
MARK = "改"  # the fake corrector's mark on its answers
TOP1 = "喂你好密碼我要進去"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Start gunicorn around the fake-corrector app; return once /readyz is 200."""
    port = free_port()
    log = tmp_path_factory.mktemp("gunicorn") / "stderr.jsonl"
    settings = {"HTTP_THREADS": "16", "MAX_BATCH_SIZE": "8", "JUDGE_TIMEOUT_S": "1.0"}
    with gunicorn("tests.fakes:create_fake_app()", port, log, settings):
        yield LiveServer(port, log)


def question(name: str) -> bytes:
    return json.dumps({"esun_uuid": name, "esun_timestamp": 1590493849, "retry": 2,
                       "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}).encode()


def request_lines(log: Path, esun_uuid: str) -> list[dict]:
    """The request's log lines, once one is there: the process's log writer writes a line after its answer left (a
    read at once sometimes found none)."""

    def lines() -> list[dict]:
        text = log.read_text(encoding="utf-8")
        whole = text[: text.rfind("\n") + 1]  # not a line the writer is still writing
        parsed = [json.loads(line) for line in whole.splitlines() if line.startswith("{")]
        return [line for line in parsed if line.get("msg") == "inference" and line.get("esun_uuid") == esun_uuid]

    wait_for(lambda: bool(lines()), f"the log line of {esun_uuid}", timeout_s=5.0)
    return lines()


def test_gunicorn_counts_the_budget_from_the_first_byte_of_a_request_on_a_connection_opened_early(
        server: LiveServer):
    """Regression: the clock started at TCP accept, so a client that opened its connection and sent 2 s later was
    answered TOP1 (late_accept), and the log recorded seconds for answers the client got within milliseconds."""
    body = question("opened-early")
    head = (f"POST /inference HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        time.sleep(BUDGET_S + 0.1)  # accepted now; the request itself comes after the whole budget
        sent = time.monotonic()
        sock.sendall(head + body)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    answered_ms = (time.monotonic() - sent) * 1000
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line.split()[1] == b"200"
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["answer"] == MARK + TOP1  # the model's answer
    [line] = request_lines(server.log, "opened-early")
    assert line["path"] == "model"
    assert abs(line["latency_ms"] - answered_ms) < 50, (line["latency_ms"], answered_ms)


def test_gunicorn_stamps_a_kept_alive_connection_when_its_next_request_arrives(server: LiveServer):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        answers = []
        for name in ("kept-alive-1", "kept-alive-2"):
            connection.request("POST", "/inference", body=question(name),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200
            answers.append(json.loads(response.read())["answer"])
            time.sleep(BUDGET_S + 0.1)  # idle on the same connection (well within gunicorn's keepalive)
    finally:
        connection.close()
    assert answers == [MARK + TOP1, MARK + TOP1]
    [line] = request_lines(server.log, "kept-alive-2")
    assert line["path"] == "model"
    assert line["queued_ms"] < BUDGET_S * 1000 / 3
