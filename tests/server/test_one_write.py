"""server.one_write.in_one_write: gunicorn's Response writes an answer's head and body in one sendall.

Regression (issue 40): gunicorn 27.0.1 writes the head and the body in two calls; a replica killed between them left
nginx a head without its body, already passed to its client (`IncompleteRead(0 bytes read, 201 more expected)`, one
answer in six replica kills under load), too late to send the request to the other replica.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from gunicorn import http
from gunicorn.config import Config as GunicornConfig
from gunicorn.http import wsgi

from server.one_write import in_one_write

CLIENT = ("127.0.0.1", 50000)
SERVER = ("127.0.0.1", 8080)


class RecordingSocket:
    """What gunicorn's Response writes, one entry per sendall."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.calls.append(bytes(data))


@pytest.fixture
def request_() -> Iterator[Any]:
    """A parsed `POST /inference` (HTTP/1.1), as gthread's thread gets it."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"POST /inference HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
        yield next(iter(http.get_parser(GunicornConfig(), ours, CLIENT)))


def serve(req: Any, app: Callable[..., Iterable[bytes]]) -> list[bytes]:
    """Run `app` through in_one_write as gthread's handle_request does; return the sendall calls."""
    sock = RecordingSocket()
    resp, environ = wsgi.create(req, sock, CLIENT, SERVER, GunicornConfig())
    body = in_one_write(app)(environ, resp.start_response)
    if isinstance(body, environ["wsgi.file_wrapper"]):
        resp.write_file(body)
    else:
        for item in body:
            resp.write(item)
    resp.close()
    if hasattr(body, "close"):
        body.close()
    return sock.calls


def test_an_answer_with_a_body_leaves_in_one_sendall(request_):
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "15")])
        return [b'{"answer":"ok"}']

    calls = serve(request_, app)
    assert len(calls) == 1
    assert calls[0].startswith(b"HTTP/1.1 200 OK\r\n") and calls[0].endswith(b'\r\n\r\n{"answer":"ok"}')


def test_an_answer_without_a_body_sends_its_head_at_close(request_):
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("204 No Content", [])
        return []

    calls = serve(request_, app)
    assert len(calls) == 1 and calls[0].startswith(b"HTTP/1.1 204 No Content\r\n")


def test_a_chunked_answer_keeps_its_bytes_in_order_head_with_the_first_chunk(request_):
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])  # no length: chunked in HTTP/1.1
        return [b"ab", b"cd"]

    calls = serve(request_, app)
    assert calls[0].startswith(b"HTTP/1.1 200 OK\r\n") and calls[0].endswith(b"\r\n\r\n2\r\nab\r\n")
    assert b"".join(calls[1:]) == b"2\r\ncd\r\n0\r\n\r\n"


def test_a_file_body_is_iterated_after_its_head_never_sendfiled_before_it(request_):
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        start_response("200 OK", [("Content-Length", "4")])
        return environ["wsgi.file_wrapper"](io.BytesIO(b"file"))

    calls = serve(request_, app)
    assert len(calls) == 1 and calls[0].endswith(b"\r\n\r\nfile")
