"""One HTTP/1.1 request read by the worker's event loop as its bytes arrive, framed by httptools (llhttp, in C), and
the few responses the event loop sends itself (a door answer, a refusal, `100 Continue`), written by hand.

llhttp frames the request exactly (head, then the body by Content-Length or chunked coding) and refuses what
HTTP/1.1 forbids (a bare LF as line terminator, conflicting or signed lengths, a length with chunked, malformed
chunks, whitespace or folding where a header may hold none); the reader adds what llhttp lets through and HTTP/1.1
or this service does not: a head over `MAX_HEAD_BYTES` (431), an HTTP/1.1 request without Host, chunked coding in
HTTP/1.0 (400), a transfer coding other than chunked alone (501), a body over the service's limit (413). It tells
where the request ends, so that the bytes read behind it stay for the next one. gunicorn's own parser reads the same
bytes again on the thread that serves the request; what it would refuse is mostly refused here first, and the rest
(`JsonErrorPages`, in the worker's `handle_error`) goes out as the same JSON error body, not gunicorn's HTML page.
That second reading is only a model-bound request's, off the door's path: about
31 µs of CPU for a 2.4 kB request (gunicorn 27.0.1's parser and body reader, docs/benchmarks.md, issue 31), where a
model answer costs milliseconds. Handing the thread this reader's request instead would mean building gunicorn's
`Request` outside its parser, for which gunicorn has no extension point.

A door answer was 170-186 µs of CPU with h11 framing and writing (docs/benchmarks.md, issue 31): h11 alone took about
41 µs to frame a 1.4 kB request and 36 µs to write an answer; llhttp frames it in about 4 µs, and the answer's head
is one bytes format.
"""

from __future__ import annotations

import enum
import html
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import httptools

from api.errors import REFUSAL_CODES, error_body

# A request's head (request line and headers) may be this long; nginx's default buffers hold as much
# (large_client_header_buffers 4 8k). The judge's heads are a few hundred bytes.
MAX_HEAD_BYTES = 32 * 1024
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
# The header fields the reader acts on (the rest are read by gunicorn's parser on the thread, and by llhttp).
_FIELDS = frozenset((b"host", b"transfer-encoding", b"expect", b"content-length"))


class Verdict(enum.Enum):
    """What the bytes read so far say about the request at their start."""

    MORE = "more"  # not whole yet: read on
    WHOLE = "whole"  # head and body are all there: a thread can parse it without waiting


@dataclass(frozen=True)
class Refusal:
    """A request answered by the event loop with an error status, without the app."""

    status: int
    detail: str

    @property
    def code(self) -> str:
        return REFUSAL_CODES.get(self.status, f"http_{self.status}")


class _Refused(Exception):
    """Raised from a parser callback to stop framing with a refusal."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


class _HttpDate:
    """The Date field's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True).encode()
        return self._value


_http_date = _HttpDate()


class RequestReader:
    """Reads the request at the start of a connection's bytes (`feed`) until it is whole or refused.

    After `WHOLE`: `method`, `path`, `body`, `keep_alive`, and `end` (where the request ends in `buffer`).
    """

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.buffer = bytearray()
        self.body = bytearray()
        self.method = b""
        self.path = b""
        self.keep_alive = False
        self.expects_continue = False  # the client waits for `100 Continue` before it sends the body
        self._url = b""
        self._fields: dict[bytes, list[bytes]] = {}  # the values of the fields of _FIELDS, by name
        self._head_done = False
        self._whole = False
        self._length: int | None = None  # the body's Content-Length (0 without one); None when chunked
        self._upgrade = False  # the request asks to switch protocols (Upgrade): llhttp stops after its head
        self._end = 0
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)

    def feed(self, data: bytes) -> Verdict | Refusal:
        """Take the next bytes of the connection; say whether the request is whole, refused, or needs more."""
        if self._whole:  # bytes behind a whole request belong to the next one
            self.buffer += data
            return Verdict.WHOLE
        verdict = self._feed(data)
        if verdict is not Verdict.MORE:
            # The parser holds this reader as its callbacks' object: dropped once the request is read, so that the
            # pair is freed at once instead of left to the cyclic garbage collector, one cycle per request.
            self._parser = None
        return verdict

    def _feed(self, data: bytes) -> Verdict | Refusal:
        start = len(self.buffer)
        self.buffer += data
        if self._upgrade:
            return self._upgrade_body()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            # Not bound to a local: the callback's exception holds this frame in its traceback (a cycle).
            if isinstance(exc.__context__, _Refused):
                return exc.__context__.refusal
            if not isinstance(exc.__context__, _Whole):
                raise
        except httptools.HttpParserUpgrade:
            return self._upgrade_body()
        except httptools.HttpParserError as exc:
            return Refusal(400, str(exc) or "malformed request")
        if self._whole:
            self._end = self._find_end(start)
            return Verdict.WHOLE
        if not self._head_done and len(self.buffer) > MAX_HEAD_BYTES:
            return Refusal(431, f"the request's head is over {MAX_HEAD_BYTES} bytes")
        return Verdict.MORE

    @property
    def end(self) -> int:
        """Where the request ends in `buffer`: the bytes after it belong to the next request."""
        return self._end

    def continue_100(self) -> bytes:
        return CONTINUE_100

    @staticmethod
    def response(status: int, json_body: bytes, keep_alive: bool) -> bytes:
        """A whole response with a JSON body, as gunicorn's own would read (its Server and Date fields)."""
        return b"HTTP/1.1 %d %s\r\nServer: gunicorn\r\nDate: %s\r\nConnection: %s\r\nContent-Type: application/json" \
               b"\r\nContent-Length: %d\r\n\r\n%s" % (status, _REASONS.get(status, b""), _http_date(),
                                                      b"keep-alive" if keep_alive else b"close", len(json_body),
                                                      json_body)

    @staticmethod
    def refusal_response(refusal: Refusal) -> bytes:
        """The app's JSON error body for `refusal`, closing the connection."""
        return RequestReader.response(refusal.status, error_body(refusal.code, refusal.detail), keep_alive=False)

    # --- llhttp's callbacks ----------------------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _FIELDS:
            self._fields.setdefault(name, []).append(value)

    def on_headers_complete(self) -> None:
        if len(self.buffer) > MAX_HEAD_BYTES and self.buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4) < 0:
            raise _Refused(Refusal(431, f"the request's head is over {MAX_HEAD_BYTES} bytes"))
        self._head_done = True
        version = self._parser.get_http_version()
        fields = self._fields
        if version == "1.1" and b"host" not in fields:
            raise _Refused(Refusal(400, "an HTTP/1.1 request must name its Host"))
        encodings = fields.get(b"transfer-encoding")
        if encodings is not None:
            if version == "1.0":
                raise _Refused(Refusal(400, "Transfer-Encoding in HTTP/1.0"))
            if [t.strip().lower() for value in encodings for t in value.split(b",")] != [b"chunked"]:
                raise _Refused(Refusal(501, "only the chunked transfer coding is supported"))
        self.method = self._parser.get_method()
        self.path = self._url.partition(b"?")[0]
        self.keep_alive = version == "1.1" and self._parser.should_keep_alive()
        self.expects_continue = version == "1.1" and any(
            value.strip().lower() == b"100-continue" for value in fields.get(b"expect", ()))
        lengths = fields.get(b"content-length")
        length = int(lengths[0]) if lengths else 0
        self._length = None if encodings is not None else length
        if length > self.max_body_bytes:
            raise _Refused(self._too_large())

    def on_body(self, body: bytes) -> None:
        self.expects_continue = False
        self.body += body
        if len(self.body) > self.max_body_bytes:
            raise _Refused(self._too_large())

    def on_message_complete(self) -> None:
        if self._parser.should_upgrade():
            # llhttp ends the message with its head and leaves the rest to the new protocol; the service does not
            # switch (gunicorn's thread serves it as plain HTTP/1.1), so the body is read by its length here
            self._upgrade = True
            return
        self._whole = True
        self.expects_continue = False
        raise _Whole  # stop here: bytes behind the request are the next one's, parsed by its own reader

    # --- helpers ---------------------------------------------------------------------------------------------

    def _find_end(self, start: int) -> int:
        """Where the request ended. llhttp stops at the end of the message (the callback raised) but does not say
        where: by Content-Length (or no body) it is the head's end plus the length; for a chunked body, fresh parsers
        find the shortest prefix of the buffer that completes it (a rare request: a few µs a try, ~log2(n) tries)."""
        if self._length is not None:
            return self.buffer.find(b"\r\n\r\n") + 4 + self._length
        low, high = max(start, 1), len(self.buffer)
        if _completes(bytes(self.buffer[:low])):
            return low
        while high - low > 1:  # _completes(buffer[:high]) holds, _completes(buffer[:low]) does not
            mid = (low + high) // 2
            if _completes(bytes(self.buffer[:mid])):
                high = mid
            else:
                low = mid
        return high

    def _upgrade_body(self) -> Verdict | Refusal:
        """A request with an Upgrade header, which the service answers as plain HTTP/1.1: whole when its
        Content-Length's bytes are there (a chunked one is refused: llhttp no longer frames it)."""
        if self._length is None:
            return Refusal(501, "a chunked body with a protocol upgrade is not supported")
        head_end = self.buffer.find(b"\r\n\r\n") + 4
        if len(self.buffer) < head_end + self._length:
            return Verdict.MORE
        self.body = self.buffer[head_end : head_end + self._length]
        self._whole, self._end = True, head_end + self._length
        self.expects_continue = False
        return Verdict.WHOLE

    def _too_large(self) -> Refusal:
        return Refusal(413, f"body must be under {self.max_body_bytes} bytes")


class _Whole(Exception):
    """Raised from on_message_complete: llhttp stops at the end of the request."""


class _Probe:
    """Callbacks of a parser that only tells whether bytes complete one message."""

    def __init__(self) -> None:
        self.done = False

    def on_message_complete(self) -> None:
        self.done = True
        raise _Whole


def _completes(data: bytes) -> bool:
    probe = _Probe()
    try:
        httptools.HttpRequestParser(probe).feed_data(data)
    except httptools.HttpParserCallbackError:
        pass
    except httptools.HttpParserError:
        return False
    return probe.done


class JsonErrorPages:
    """A client socket as gunicorn's `handle_error` writes to it: the HTML error page it sends (`util.write_error`)
    goes out as the app's JSON error body, with its status and its message as the detail. It catches what gunicorn's
    parser refuses that the reader let through (an HTTP/2.0 request line, a URI over gunicorn's request-line limit,
    a second Host), and an error before the app (a 500 without a message, never a traceback)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(json_error_page(data))


def json_error_page(page: bytes) -> bytes:
    """gunicorn's whole HTML error response (status line, fields, page) as the app's JSON error response."""
    head, _, body = page.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ", 2)
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 500
    message = html.unescape(body.decode("latin-1").rpartition("</h1>")[2].partition("</body>")[0]).strip()
    detail = message or _REASONS.get(status, b"error").decode()
    return RequestReader.refusal_response(Refusal(status, detail))
