"""One HTTP/1.1 request read by the worker's event loop as its bytes arrive, framed by h11, and the few responses the
event loop sends itself (a door answer, a refusal, `100 Continue`), written by the same h11 connection.

h11 frames the request exactly (head, then the body by Content-Length or chunked coding, nothing else), refuses
what HTTP/1.1 forbids (conflicting lengths, a length with chunked, other codings, malformed chunks, a head over
`MAX_HEAD_BYTES`) with the status it names, and tells where the request ends, so that the bytes read behind it
stay for the next one. gunicorn's own parser reads the same bytes again on the thread that serves the request; it
rejects three things h11 accepts (a bare LF as line terminator; Content-Length beside Transfer-Encoding, which
RFC 9112 6.1 lets a server refuse; chunked coding in HTTP/1.0), which are refused here too, so that every refusal is
the app's JSON error body.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

import h11

# A request's head (request line and headers) may be this long; nginx's default buffers hold as much
# (large_client_header_buffers 4 8k). The judge's heads are a few hundred bytes.
MAX_HEAD_BYTES = 32 * 1024
# The error codes of the JSON body, as the app names them (api/errors.py).
_CODES = {400: "bad_request", 413: "payload_too_large", 431: "header_fields_too_large", 501: "not_implemented"}


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
        return _CODES.get(self.status, f"http_{self.status}")


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
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    def feed(self, data: bytes) -> Verdict | Refusal:
        """Take the next bytes of the connection; say whether the request is whole, refused, or needs more."""
        self.buffer += data
        self._h11.receive_data(data)
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                return Refusal(exc.error_status_hint, str(exc))
            if event is h11.NEED_DATA:
                return Verdict.MORE
            if isinstance(event, h11.Request):
                refused = self._read_head(event)
                if refused is not None:
                    return refused
            elif isinstance(event, h11.Data):
                self.body += event.data
                if len(self.body) > self.max_body_bytes:
                    return self._too_large()
            else:  # EndOfMessage (PAUSED and ConnectionClosed cannot come before it: no b"" is fed)
                return Verdict.WHOLE

    @property
    def expects_continue(self) -> bool:
        """Whether the client waits for `100 Continue` before it sends the body."""
        return self._h11.they_are_waiting_for_100_continue

    @property
    def end(self) -> int:
        """Where the request ends in `buffer`: the bytes after it belong to the next request."""
        return len(self.buffer) - len(self._h11.trailing_data[0])

    def continue_100(self) -> bytes:
        return self._h11.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))

    def response(self, status: int, json_body: bytes, keep_alive: bool) -> bytes:
        """A whole response with a JSON body, as gunicorn's own would read (its Server and Date fields)."""
        headers = [("Server", "gunicorn"), ("Date", formatdate(usegmt=True)),
                   ("Connection", "keep-alive" if keep_alive else "close"), ("Content-Type", "application/json"),
                   ("Content-Length", str(len(json_body)))]
        head = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())
        return self._h11.send(head) + self._h11.send(h11.Data(data=json_body)) + self._h11.send(h11.EndOfMessage())

    def refusal_response(self, refusal: Refusal) -> bytes:
        """The app's JSON error body for `refusal`, closing the connection."""
        body = json.dumps({"error": refusal.code, "detail": refusal.detail}).encode()
        return self.response(refusal.status, body, keep_alive=False)

    def _read_head(self, request: h11.Request) -> Refusal | None:
        head = self.buffer[:self.end]
        if head.count(b"\n") != head.count(b"\r\n"):
            return Refusal(400, "bare LF as line terminator")
        names = {name for name, _ in request.headers}
        if b"transfer-encoding" in names and (b"content-length" in names or request.http_version == b"1.0"):
            return Refusal(400, "Transfer-Encoding with Content-Length, or in HTTP/1.0")
        self.method = request.method
        self.path = request.target.partition(b"?")[0]
        tokens = {t.strip().lower() for name, value in request.headers if name == b"connection"
                  for t in value.split(b",")}
        self.keep_alive = request.http_version == b"1.1" and b"close" not in tokens
        length = next((int(value) for name, value in request.headers if name == b"content-length"), 0)
        return self._too_large() if length > self.max_body_bytes else None

    def _too_large(self) -> Refusal:
        return Refusal(413, f"body must be under {self.max_body_bytes} bytes")
