"""api.worker.RequestFrame: when the bytes read so far hold a whole request, as gunicorn's parser will frame it.

The worker's event loop hands a request to a thread only on `Verdict.WHOLE`, so a thread never waits on the
socket; a request that can never be framed, or is over the limits, is refused by the event loop at once.
"""

from __future__ import annotations

import json

import pytest

from api.worker import Refusal, RequestFrame, Verdict

MAX_BODY = 1000
BODY = b'{"esun_uuid": "x", "sentence_list": ["a b"]}'


def frame() -> RequestFrame:
    return RequestFrame(max_body_bytes=MAX_BODY, max_head_bytes=2048)


def head(*fields: str, request_line: str = "POST /inference HTTP/1.1") -> bytes:
    return ("\r\n".join([request_line, "Host: x", *fields]) + "\r\n\r\n").encode()


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def verdicts_byte_by_byte(data: bytes) -> list[Verdict | Refusal]:
    """Feed the request one byte at a time, as the slowest client would, to the same frame."""
    checker = frame()
    return [checker.check(data[:end]) for end in range(1, len(data) + 1)]


@pytest.mark.parametrize("request_bytes", [
    head(f"Content-Length: {len(BODY)}") + BODY,
    head("Transfer-Encoding: chunked") + chunked(BODY, 7),
    head(request_line="GET /healthz HTTP/1.1"),
    head("Transfer-Encoding: chunked") + chunked(BODY, 100)[:-2] + b"Trailer-Field: 1\r\n\r\n",
], ids=["content-length", "chunked", "no-body", "chunked-with-trailer"])
def test_a_request_is_whole_only_at_its_last_byte(request_bytes):
    verdicts = verdicts_byte_by_byte(request_bytes)
    assert verdicts[-1] is Verdict.WHOLE
    assert set(verdicts[:-1]) == {Verdict.MORE}


def test_bytes_of_a_next_request_behind_a_whole_one_leave_it_whole():
    first = head(f"Content-Length: {len(BODY)}") + BODY
    assert frame().check(first + b"POST /infer") is Verdict.WHOLE


def test_a_declared_body_over_max_body_bytes_is_refused_with_the_head_alone():
    verdict = frame().check(head(f"Content-Length: {MAX_BODY + 1}"))
    assert verdict == Refusal(413, "payload_too_large", f"body must be under {MAX_BODY} bytes")


def test_a_body_of_exactly_max_body_bytes_is_read():
    assert frame().check(head(f"Content-Length: {MAX_BODY}")) is Verdict.MORE


def test_chunks_adding_up_to_more_than_max_body_bytes_are_refused_before_the_rest_arrives():
    checker = frame()
    start = head("Transfer-Encoding: chunked") + b"%x\r\n" % (MAX_BODY // 2) + b"a" * (MAX_BODY // 2) + b"\r\n"
    assert checker.check(start) is Verdict.MORE
    verdict = checker.check(start + b"%x\r\n" % (MAX_BODY // 2 + 1))
    assert isinstance(verdict, Refusal) and verdict.status == 413


def test_a_head_longer_than_max_head_bytes_is_refused():
    verdict = frame().check(b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * 2100)
    assert isinstance(verdict, Refusal) and verdict.status == 431


@pytest.mark.parametrize("request_bytes", [
    b"POST / HTTP/1.1\nHost: x\n\n",
    head("Content-Length: 5", "Content-Length: 5"),
    head("Content-Length: +5"),
    head("Content-Length: 5", "Transfer-Encoding: chunked"),
    head("Transfer-Encoding: gzip"),
    head("Transfer-Encoding: chunked, chunked"),
    head("Transfer-Encoding: chunked", request_line="POST / HTTP/1.0"),
    head("Transfer-Encoding: chunked") + b"zz\r\n",
    head("Transfer-Encoding: chunked") + b"3\r\nabcd\r\n",
], ids=["bare-lf", "two-lengths", "signed-length", "length-and-chunked", "not-chunked-last", "chunked-twice",
        "chunked-http-1.0", "bad-chunk-size", "chunk-longer-than-its-size"])
def test_framing_gunicorn_rejects_is_refused_as_a_bad_request(request_bytes):
    verdict = frame().check(request_bytes)
    assert isinstance(verdict, Refusal)
    assert (verdict.status, verdict.code) == (400, "bad_request")


def test_endless_chunk_framing_without_data_is_refused():
    verdict = frame().check(head("Transfer-Encoding: chunked") + b"1;" + b"x" * 20_000)
    assert isinstance(verdict, Refusal) and verdict.status == 400


def test_a_request_expecting_100_continue_is_flagged_once_its_head_is_read():
    checker = frame()
    assert checker.check(head(f"Content-Length: {len(BODY)}", "Expect: 100-Continue")) is Verdict.MORE
    assert checker.expects_continue and checker.waits_for_body


def test_an_http_10_request_expecting_100_continue_is_not_flagged():
    checker = frame()
    checker.check(head("Content-Length: 3", "Expect: 100-continue", request_line="POST / HTTP/1.0"))
    assert not checker.expects_continue


def test_a_refusal_is_a_closing_json_answer_like_the_apps_errors():
    response = Refusal(413, "payload_too_large", "body must be under 1000 bytes").response()
    status_head, _, body = response.partition(b"\r\n\r\n")
    lines = status_head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 413 Content Too Large"
    assert {"Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"} <= set(lines)
    assert json.loads(body) == {"error": "payload_too_large", "detail": "body must be under 1000 bytes"}


@pytest.mark.parametrize(("request_line", "fields", "keep_alive"), [
    ("POST /inference HTTP/1.1", (), True),
    ("POST /inference?x=1 HTTP/1.1", ("Connection: keep-alive, Close",), False),
    ("POST /inference HTTP/1.0", ("Connection: keep-alive",), False),  # the door closes HTTP/1.0 connections
])
def test_the_head_tells_the_door_its_route_and_whether_the_connection_stays_open(request_line, fields, keep_alive):
    checker = frame()
    data = head(*fields, f"Content-Length: {len(BODY)}", request_line=request_line) + BODY + b"POST /next"
    assert checker.check(data) is Verdict.WHOLE
    assert (checker.method, checker.path, checker.keep_alive) == (b"POST", b"/inference", keep_alive)
    start, end = checker.body_span
    assert data[start:end] == BODY and data[end:] == b"POST /next"  # the next request's bytes stay behind


def test_a_chunked_body_has_no_span_so_the_door_leaves_it_to_a_thread():
    checker = frame()
    assert checker.check(head("Transfer-Encoding: chunked") + chunked(BODY, 7)) is Verdict.WHOLE
    assert checker.body_span is None
