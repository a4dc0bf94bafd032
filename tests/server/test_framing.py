"""server.framing.RequestReader: when the bytes read so far hold a whole request (llhttp's framing, through
httptools), and the responses the event loop writes itself.

The worker's event loop hands a request to a thread only on `Verdict.WHOLE`, so a thread never waits on the
socket; a request that can never be framed, or is over the limits, is refused by the event loop at once.
"""

from __future__ import annotations

import json

import pytest
from gunicorn import util

from server.framing import MAX_HEAD_BYTES, JsonErrorPages, Refusal, RequestReader, Verdict

MAX_BODY = 1000
BODY = b'{"esun_uuid": "x", "sentence_list": ["a b"]}'


def reader() -> RequestReader:
    return RequestReader(max_body_bytes=MAX_BODY)


def head(*fields: str, request_line: str = "POST /inference HTTP/1.1") -> bytes:
    return ("\r\n".join([request_line, "Host: x", *fields]) + "\r\n\r\n").encode()


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def verdicts_byte_by_byte(data: bytes) -> list[Verdict | Refusal]:
    """Feed the request one byte at a time, as the slowest client would, to the same reader."""
    one = reader()
    return [one.feed(data[i:i + 1]) for i in range(len(data))]


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


def test_a_chunked_body_is_read_whole_for_the_door():
    one = reader()
    assert one.feed(head("Transfer-Encoding: chunked") + chunked(BODY, 7)) is Verdict.WHOLE
    assert bytes(one.body) == BODY


def test_a_declared_body_over_max_body_bytes_is_refused_with_the_head_alone():
    assert reader().feed(head(f"Content-Length: {MAX_BODY + 1}")) == Refusal(413, f"body must be under {MAX_BODY} "
                                                                                "bytes")


def test_a_body_of_exactly_max_body_bytes_is_read():
    assert reader().feed(head(f"Content-Length: {MAX_BODY}")) is Verdict.MORE


def test_chunks_adding_up_to_more_than_max_body_bytes_are_refused_before_the_rest_arrives():
    one = reader()
    start = head("Transfer-Encoding: chunked") + b"%x\r\n" % (MAX_BODY // 2) + b"a" * (MAX_BODY // 2) + b"\r\n"
    assert one.feed(start) is Verdict.MORE
    verdict = one.feed(b"%x\r\n" % (MAX_BODY // 2 + 1) + b"a" * (MAX_BODY // 2 + 1))
    assert isinstance(verdict, Refusal) and verdict.status == 413


def test_a_head_longer_than_max_head_bytes_is_refused():
    verdict = reader().feed(b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 100))
    assert isinstance(verdict, Refusal) and (verdict.status, verdict.code) == (431, "header_fields_too_large")


@pytest.mark.parametrize("request_bytes", [
    b"POST / HTTP/1.1\nHost: x\n\n",
    head("Content-Length: 5", "Content-Length: 6"),
    head("Content-Length: +5"),
    head("Content-Length: 5", "Transfer-Encoding: chunked"),
    head("Transfer-Encoding: chunked", request_line="POST / HTTP/1.0"),
    head("Transfer-Encoding: chunked") + b"zz\r\n",
    head("Transfer-Encoding: chunked") + b"3\r\nabcd\r\n",
    b"POST / HTTP/1.1\r\n\r\n",
], ids=["bare-lf", "two-lengths", "signed-length", "length-and-chunked", "chunked-http-1.0", "bad-chunk-size",
        "chunk-longer-than-its-size", "no-host"])
def test_framing_http_11_forbids_is_refused_as_a_bad_request(request_bytes):
    verdict = reader().feed(request_bytes)
    assert isinstance(verdict, Refusal)
    assert (verdict.status, verdict.code) == (400, "bad_request")


@pytest.mark.parametrize("coding", ["gzip", "gzip, chunked", "chunked, chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused_as_not_implemented(coding):
    verdict = reader().feed(head(f"Transfer-Encoding: {coding}"))
    assert isinstance(verdict, Refusal) and verdict.status in (400, 501)


def test_a_request_expecting_100_continue_is_flagged_once_its_head_is_read_and_answered_by_the_reader():
    one = reader()
    assert one.feed(head(f"Content-Length: {len(BODY)}", "Expect: 100-Continue")) is Verdict.MORE
    assert one.expects_continue
    assert one.continue_100().startswith(b"HTTP/1.1 100 ")
    assert one.feed(BODY) is Verdict.WHOLE


def test_an_http_10_request_expecting_100_continue_is_not_flagged():
    one = reader()
    one.feed(head("Content-Length: 3", "Expect: 100-continue", request_line="POST / HTTP/1.0"))
    assert not one.expects_continue


def test_a_refusal_is_a_closing_json_answer_like_the_apps_errors():
    one = reader()
    refusal = one.feed(head(f"Content-Length: {MAX_BODY + 1}"))
    status_head, _, body = one.refusal_response(refusal).partition(b"\r\n\r\n")
    lines = status_head.decode().lower().split("\r\n")
    assert lines[0].startswith("http/1.1 413 ")
    assert {"content-type: application/json", f"content-length: {len(body)}", "connection: close"} <= set(lines)
    assert json.loads(body) == {"error": "payload_too_large", "detail": "body must be under 1000 bytes"}


@pytest.mark.parametrize("over", [1, 500], ids=["one_byte_over_the_views_check", "werkzeugs_limit"])
def test_the_event_loops_413_body_is_byte_for_byte_the_apps(over):
    """Issue 62: the 413 a newcomer met (the event loop's) was formatted unlike every other error body (the app's:
    Flask's compact, sorted JSON), and the app's own 413 said werkzeug's "exceeds the capacity limit", no limit."""
    import dataclasses

    from api import create_app
    from config import Config
    from tests.fakes import FakeCorrector

    app = create_app(dataclasses.replace(Config(device="cpu"), max_body_bytes=MAX_BODY), corrector=FakeCorrector())
    body = b"{" + b" " * (MAX_BODY + over - 2) + b"}"
    answer = app.test_client().post("/inference", data=body, content_type="application/json")
    refusal = reader().feed(head(f"Content-Length: {MAX_BODY + 1}"))

    assert answer.status_code == 413
    assert reader().refusal_response(refusal).partition(b"\r\n\r\n")[2] == answer.data


@pytest.mark.parametrize(("request_line", "fields", "keep_alive"), [
    ("POST /inference HTTP/1.1", (), True),
    ("POST /inference?x=1 HTTP/1.1", ("Connection: keep-alive, Close",), False),
    ("POST /inference HTTP/1.0", ("Connection: keep-alive",), False),  # the door closes HTTP/1.0 connections
])
def test_the_head_tells_the_door_its_route_and_whether_the_connection_stays_open(request_line, fields, keep_alive):
    one = reader()
    data = head(*fields, f"Content-Length: {len(BODY)}", request_line=request_line) + BODY + b"POST /next"
    assert one.feed(data) is Verdict.WHOLE
    assert (one.method, one.path, one.keep_alive) == (b"POST", b"/inference", keep_alive)
    assert bytes(one.body) == BODY
    assert data[one.end:] == b"POST /next"  # the next request's bytes stay behind


def test_a_door_answer_is_a_200_with_the_json_body_and_gunicorns_fields():
    one = reader()
    one.feed(head(f"Content-Length: {len(BODY)}") + BODY)
    status_head, _, body = one.response(200, b'{"answer":"x"}', keep_alive=True).partition(b"\r\n\r\n")
    lines = status_head.decode().lower().split("\r\n")
    assert lines[0] == "http/1.1 200 ok"
    assert {"connection: keep-alive", "content-length: 14", "server: gunicorn"} <= set(lines)
    assert body == b'{"answer":"x"}'


@pytest.mark.parametrize("size", [1, 7, 100])
def test_a_chunked_request_ends_where_its_last_chunk_does_and_the_next_requests_bytes_stay_behind(size):
    data = head("Transfer-Encoding: chunked") + chunked(BODY, size) + b"POST /next HTTP/1.1\r\n"
    one = reader()
    assert one.feed(data) is Verdict.WHOLE
    assert bytes(one.body) == BODY and data[one.end:] == b"POST /next HTTP/1.1\r\n"


def test_bytes_fed_after_a_whole_request_are_kept_for_the_next_one():
    one = reader()
    assert one.feed(head(f"Content-Length: {len(BODY)}") + BODY) is Verdict.WHOLE
    assert one.feed(b"GET /healthz") is Verdict.WHOLE
    assert bytes(one.buffer[one.end:]) == b"GET /healthz"


UPGRADE = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA")


def test_a_request_asking_to_upgrade_is_read_whole_with_its_body_as_plain_http_11():
    """curl --http2 on an http:// URL asks to switch to h2c; llhttp stops at such a request's head, and the service
    answers it as HTTP/1.1, so its body is read by its length, however it arrives."""
    data = head(*UPGRADE, f"Content-Length: {len(BODY)}") + BODY
    assert verdicts_byte_by_byte(data)[-1] is Verdict.WHOLE
    assert set(verdicts_byte_by_byte(data)[:-1]) == {Verdict.MORE}
    one = reader()
    assert one.feed(data + b"GET /next") is Verdict.WHOLE
    assert bytes(one.body) == BODY and bytes(one.buffer[one.end:]) == b"GET /next"


def test_a_chunked_body_with_an_upgrade_is_refused_as_not_implemented():
    verdict = reader().feed(head(*UPGRADE, "Transfer-Encoding: chunked") + chunked(BODY, 7))
    assert isinstance(verdict, Refusal) and verdict.status == 501


class _Sent:
    """A socket that keeps what is sent on it."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


@pytest.mark.parametrize(("status", "reason", "message"), [
    (400, "Bad Request", "Invalid HTTP Version '(2, 0)'"),
    (414, "URI Too Long", "<script>x</script> & more"),
    (500, "Internal Server Error", ""),
])
def test_gunicorns_html_error_page_goes_out_as_the_apps_json_error_with_its_status(status, reason, message):
    sent = _Sent()
    util.write_error(JsonErrorPages(sent), status, reason, message)

    head, _, body = sent.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status)
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert json.loads(body) == {"error": Refusal(status, "").code, "detail": message or reason}
