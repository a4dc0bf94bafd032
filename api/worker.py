"""gunicorn's gthread worker, reading each request whole in its event loop before a thread serves it.

api/gunicorn_conf.py names `StampingThreadWorker` as `worker_class`. Three additions to gthread:

- **Slow clients never hold a thread.** gthread hands a connection to its thread pool as soon as it is accepted
  (or as soon as a kept-alive one turns readable), and the thread then blocks reading the request: a client that
  sends a few bytes of headers and then nothing holds that thread until it gives up, so about as many such
  connections as threads stopped the service (issue 14: 140 against 128). Here the event loop (the worker's main
  thread, gthread's poller) reads every request itself, without blocking, until it is whole (`RequestFrame`: the
  head, then the body by Content-Length or chunked framing), and only then hands it to the pool; the thread's
  parser reads the buffered bytes and never waits on the socket. A connection that does not complete its request
  within `REQUEST_READ_TIMEOUT_S` is closed by the event loop, unanswered, without a thread ever touching it. A
  request the service would refuse anyway (a body over `MAX_BODY_BYTES`, a head over `MAX_HEAD_BYTES`, framing
  gunicorn's parser rejects) is answered by the event loop with the app's JSON error body and `Connection: close`,
  without waiting for the rest of it.
- **The accept stamp** (api.accept): each request's `environ[ACCEPTED_AT_KEY]`, the `time.monotonic()` when the
  first bytes of the request reached the event loop (see api.accept).
- **The door** (api.door): before handing a whole `POST /inference` (Content-Length framed) to the pool, the event
  loop asks the app's door, which answers it at once (TOP1 or a stored answer) when `POOL_LIMIT` requests are in
  the pool already or no model slot is free. The event loop sends that answer and keeps the connection as gthread
  would after a thread's answer (kept alive, or closed when the client asked to or the worker is stopping). The
  pool's count goes up when the event loop hands a request on and down when the app has answered it (before the
  answer is written: a closed-loop client's next request must not find its own last one still counted).

gthread's methods overridden, and why (everything else is gthread's own behaviour):

- `enqueue_req`: gthread's one door into the thread pool (from `accept`, a kept-alive connection turning
  readable, and bytes of a next request already read behind the last one). Here it stamps the connection and
  starts reading; `super().enqueue_req` is called only once the request is whole.
- `murder_pending`: called by gthread's run loop after every pass (at least once a second, also while it drains
  on stop); here it also closes the connections whose read timeout passed. gthread's own pending connections
  (deferred by a thread that saw no data) stay as they are; with whole requests a thread no longer defers any.
- `handle_request`: puts the stamp where the app wrapper finds it, and tells gunicorn not to send
  `100 Continue` a second time when the event loop already sent it.
- `handle`: counts the request out of the pool if the app did not (an error before the app).
- `init_process`, `load_wsgi`: read the settings, raise the open-file limit to what `worker_connections`
  needs, find the app's metrics and door, and wrap the app so that the stamp reaches the environ (gthread offers
  no hook between building the environ and calling the app).

Not read here, handed on as gthread does today: TLS (`certfile`), HTTP/2 cleartext and the PROXY protocol, none
of which `make run` enables. The event loop wakes at least once a second, so a slow connection is closed between
`REQUEST_READ_TIMEOUT_S` and that plus one second after its request started. The cost: the event loop makes the
few syscalls per request the threads made, and each may wait for the GIL while model threads run Python code;
docs/benchmarks.md ("Slow clients") measures it with 1,000 slow connections reopened every 5 s.
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
import resource
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from api.accept import ACCEPTED_AT_KEY
from api.door import DOOR_KEY, DOOR_METHOD, DOOR_PATH
from api.metrics import METRICS_KEY
from config import Config

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# A request's head (request line and headers) may be this long; nginx's default buffers hold as much
# (large_client_header_buffers 4 8k). The judge's heads are a few hundred bytes.
MAX_HEAD_BYTES = 32 * 1024
# Bytes a chunked body may carry beyond its data (size lines, extensions, trailers) before it is refused.
MAX_CHUNK_FRAMING_BYTES = 16 * 1024
# One recv() from the event loop: a whole request of the service's size limit in one or two calls.
RECV_BYTES = 64 * 1024
# File descriptors the worker needs besides its client connections: listeners, pipes, logs, the model's files.
RESERVED_FILES = 256
CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]+")


class Verdict(enum.Enum):
    """What the bytes read so far say about the request at their start."""

    MORE = "more"  # not whole yet: read on
    WHOLE = "whole"  # head and body are all there: a thread can parse it without waiting


@dataclass(frozen=True)
class Refusal:
    """A request answered by the event loop, without the app: the same JSON body as the app's errors."""

    status: int
    code: str
    detail: str

    def response(self) -> bytes:
        body = json.dumps({"error": self.code, "detail": self.detail}).encode()
        reason = {400: "Bad Request", 413: "Content Too Large", 431: "Request Header Fields Too Large"}
        return _response(f"{self.status} {reason.get(self.status, 'Error')}".encode(), body, keep_alive=False)


def _response(status: bytes, json_body: bytes, keep_alive: bool) -> bytes:
    """A whole HTTP/1.1 response with a JSON body, as the event loop sends it."""
    head = (b"HTTP/1.1 %s\r\nServer: gunicorn\r\nDate: %s\r\nConnection: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n")
    return head % (status, formatdate(usegmt=True).encode(), b"keep-alive" if keep_alive else b"close",
                   len(json_body)) + json_body


@dataclass
class RequestFrame:
    """Where the request at the start of a buffer ends, framed as gunicorn's parser will frame it.

    `check(buffer)` is called with everything read so far (the same growing buffer each time): the head ends at
    the first empty line (CRLF CRLF, gunicorn rejects bare LF), the body is chunked when Transfer-Encoding says so,
    else Content-Length long, else empty. Framing gunicorn would reject (two lengths, a length and chunked, an
    unknown coding, a malformed chunk) is refused here, so that a thread never waits for a body it cannot frame.
    Anything else odd about the request (its method, its header names) is gunicorn's to answer, from the bytes.
    """

    max_body_bytes: int
    max_head_bytes: int = MAX_HEAD_BYTES
    head_end: int | None = None
    content_length: int = 0
    chunked: bool = False
    expects_continue: bool = False
    # From the request line and the Connection field, once the head is read (what the door needs).
    method: bytes = b""
    path: bytes = b""
    keep_alive: bool = False

    def check(self, buffer: bytes | bytearray) -> Verdict | Refusal:
        if self.head_end is None:
            refused = self._read_head(buffer)
            if refused is not None or self.head_end is None:
                return refused or Verdict.MORE
        if self.chunked:
            return self._chunked_end(buffer)
        if len(buffer) - self.head_end >= self.content_length:
            return Verdict.WHOLE
        return Verdict.MORE

    @property
    def waits_for_body(self) -> bool:
        return self.head_end is not None and (self.chunked or self.content_length > 0)

    @property
    def body_span(self) -> tuple[int, int] | None:
        """Where the body of a whole Content-Length request lies in the buffer (None: chunked, or head not read)."""
        if self.head_end is None or self.chunked:
            return None
        return self.head_end, self.head_end + self.content_length

    def _read_head(self, buffer: bytes | bytearray) -> Refusal | None:
        end = buffer.find(b"\r\n\r\n", 0, self.max_head_bytes + 4)
        if end < 0:
            if len(buffer) > self.max_head_bytes:
                return Refusal(431, "header_fields_too_large", f"request head must be under {self.max_head_bytes} "
                                                              "bytes")
            if buffer.count(b"\n") != buffer.count(b"\r\n"):
                return Refusal(400, "bad_request", "bare LF as line terminator")
            return None
        head = bytes(buffer[:end])
        if head.count(b"\n") != head.count(b"\r\n"):
            return Refusal(400, "bad_request", "bare LF as line terminator")
        request_line, _, fields = head.partition(b"\r\n")
        http_10 = request_line.rstrip().endswith(b"HTTP/1.0")
        self.method, _, target = request_line.partition(b" ")
        self.path = target.partition(b" ")[0].partition(b"?")[0]
        self.keep_alive = request_line.rstrip().endswith(b"HTTP/1.1")
        lengths: list[bytes] = []
        codings: list[bytes] = []
        for line in fields.split(b"\r\n"):
            name, colon, value = line.partition(b":")
            if not colon:
                continue  # not a field: gunicorn answers it
            name = name.lower()
            value = value.strip(b" \t")
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings.extend(v.strip(b" \t").lower() for v in value.split(b","))
            elif name == b"expect" and value.lower() == b"100-continue" and not http_10:
                self.expects_continue = True
            elif name == b"connection" and b"close" in (v.strip(b" \t").lower() for v in value.split(b",")):
                self.keep_alive = False
        refused = self._read_framing(lengths, codings, http_10)
        if refused is None:
            self.head_end = end + 4
        return refused

    def _read_framing(self, lengths: list[bytes], codings: list[bytes], http_10: bool) -> Refusal | None:
        if codings:
            if codings[-1] != b"chunked" or codings.count(b"chunked") > 1 or lengths or http_10:
                return Refusal(400, "bad_request", "unsupported Transfer-Encoding framing")
            if any(c not in (b"chunked", b"identity", b"gzip", b"deflate", b"compress") for c in codings):
                return Refusal(400, "bad_request", "unsupported Transfer-Encoding")
            self.chunked = True
            return None
        if not lengths:
            return None
        if len(lengths) > 1 or not lengths[0].isdigit():
            return Refusal(400, "bad_request", "invalid Content-Length")
        self.content_length = int(lengths[0])
        if self.content_length > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> Refusal:
        return Refusal(413, "payload_too_large", f"body must be under {self.max_body_bytes} bytes")

    def _chunked_end(self, buffer: bytes | bytearray) -> Verdict | Refusal:
        """Walk the chunks from the body's start: each size line, its data, its CRLF; then trailers to an empty line."""
        assert self.head_end is not None
        position, data_bytes = self.head_end, 0
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                return self._more_chunks(buffer, data_bytes)
            size_text = bytes(buffer[position:line_end]).partition(b";")[0].strip(b" \t")
            if not _HEX.fullmatch(size_text):
                return Refusal(400, "bad_request", "invalid chunk size")
            size = int(size_text, 16)
            position = line_end + 2
            if size == 0:
                break
            data_bytes += size
            if data_bytes > self.max_body_bytes:
                return self._too_large()
            if len(buffer) < position + size + 2:
                return self._more_chunks(buffer, data_bytes)
            if buffer[position + size:position + size + 2] != b"\r\n":
                return Refusal(400, "bad_request", "chunk data not followed by CRLF")
            position += size + 2
        while True:  # trailer fields, up to the empty line
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                return self._more_chunks(buffer, data_bytes)
            if line_end == position:
                return Verdict.WHOLE
            position = line_end + 2

    def _more_chunks(self, buffer: bytes | bytearray, data_bytes: int) -> Verdict | Refusal:
        assert self.head_end is not None
        if len(buffer) - self.head_end - data_bytes > MAX_CHUNK_FRAMING_BYTES:
            return Refusal(400, "bad_request", f"chunk framing over {MAX_CHUNK_FRAMING_BYTES} bytes")
        return Verdict.MORE


@dataclass(eq=False)
class _Reading:
    """A connection whose request the event loop is reading: its bytes so far and when it must be whole."""

    frame: RequestFrame
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)
    registered: bool = False
    closing: bool = False  # answered by the event loop with "Connection: close"; waiting for the client to close
    sent_continue: bool = False


class StampingThreadWorker(ThreadWorker):
    """gthread that hands a request to its thread pool only once read whole, stamped when its reading started.

    The module docstring says which of gthread's methods are overridden and why.
    """

    def init_process(self) -> None:
        config = Config.from_env()  # gunicorn_conf already validated the same environment in the master
        self.read_timeout_s = config.request_read_timeout_s
        self.max_body_bytes = config.max_body_bytes
        self.pool_cap = config.pool_cap
        self._reading: OrderedDict[Any, _Reading] = OrderedDict()  # in deadline order: deadlines only grow
        self._handling = threading.local()
        # Requests handed to the thread pool and not yet answered: counted up by the event loop, down by the thread
        # that answered (so that a client's next request, read before gthread's callback runs, finds it free).
        self._in_pool = 0
        self._pool_lock = threading.Lock()
        self.metrics = None  # the app's, once loaded (load_wsgi)
        self.door = None  # the app's (api.door), once loaded
        self._fit_open_file_limit()
        super().init_process()  # loads the app (load_wsgi), then runs the event loop until the worker stops

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # The app's metrics (api.metrics), where the event loop counts slow clients closed and requests refused.
        extensions = getattr(self.wsgi, "extensions", {})
        self.metrics = extensions.get(METRICS_KEY)
        self.door = extensions.get(DOOR_KEY)
        # Flask's documented place for WSGI middleware is `app.wsgi_app`: `self.wsgi` stays the Flask app, which
        # gunicorn_conf.worker_exit reads its state from.
        if hasattr(self.wsgi, "wsgi_app"):
            self.wsgi.wsgi_app = self._with_stamp(self.wsgi.wsgi_app)
        else:
            self.wsgi = self._with_stamp(self.wsgi)

    def _fit_open_file_limit(self) -> None:
        """Raise the soft open-file limit to the hard one if `worker_connections` needs more; else fit to it.

        Each connection is a file descriptor: past the limit accept() fails (EMFILE), which gthread treats as a
        fatal error. Many shells start with a soft limit of 1,024.
        """
        needed = self.worker_connections + self.cfg.threads + RESERVED_FILES
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError) as exc:
                self.log.warning("cannot raise the open-file limit from %s to %s: %s", soft, hard, exc)
        if soft != resource.RLIM_INFINITY and soft < needed:
            fitted = max(soft - self.cfg.threads - RESERVED_FILES, self.cfg.threads + 1)
            self.log.warning("open-file limit %s: worker_connections lowered from %s to %s",
                             soft, self.worker_connections, fitted)
            self.worker_connections = fitted
            self.max_keepalived = fitted - self.cfg.threads

    # --- reading requests in the event loop ------------------------------------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        now = time.monotonic()
        conn.accepted_at = now
        if not self._reads_requests(conn):
            self._submit(conn)
            return
        try:
            self._start_reading(conn, now)
        except Exception as exc:  # gthread's accept() would stop the worker on it; close this connection alone
            self.log.error("cannot read a request from %s: %r", conn.client, exc)
            self._close(conn)

    def _start_reading(self, conn: Any, now: float) -> None:
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        if conn.sock.gettimeout() != 0.0:  # a thread left it blocking (bytes of a next request were read ahead)
            conn.sock.setblocking(False)  # (a syscall, and each one in the event loop may wait for the GIL)
        reading = _Reading(RequestFrame(self.max_body_bytes), now + self.read_timeout_s,
                           bytearray(conn.parser.unreader.take_buffered()))
        self._reading[conn] = reading
        if not (reading.buffer and self._advance(conn, reading)):
            self._receive(conn, reading)

    def _reads_requests(self, conn: Any) -> bool:
        """Whether the event loop reads this connection's requests (plain HTTP/1.x, as `make run` serves)."""
        cfg = self.cfg
        return not (cfg.is_ssl or conn.is_http2 or getattr(cfg, "protocol", "http") != "http"
                    or cfg.proxy_protocol != "off" or negotiation.prior_knowledge_allowed(cfg, conn.client)
                    or negotiation.upgrade_allowed(cfg, conn.client))

    def _on_readable(self, conn: Any, _fileobj: Any) -> None:
        reading = self._reading.get(conn)
        if reading is None:
            return
        try:
            self._receive(conn, reading)
        except Exception as exc:  # raised into gthread's run loop it would stop the worker; close this one alone
            self.log.error("cannot read a request from %s: %r", conn.client, exc)
            self._close(conn)

    def _receive(self, conn: Any, reading: _Reading) -> None:
        """Read what the socket holds now, without blocking, and act on what the request then looks like."""
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            self._register(conn, reading)
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)  # the client went away (before or after a refusal): nothing to answer
            return
        if reading.closing:
            return  # discarding what the client still sends until it closes
        if not reading.buffer:  # the request's first bytes: its clock starts now (api.accept)
            conn.accepted_at = time.monotonic()
        reading.buffer += data
        if not self._advance(conn, reading):
            self._register(conn, reading)

    def _advance(self, conn: Any, reading: _Reading) -> bool:
        """Hand the request on, refuse it, or say it needs more bytes (False)."""
        try:
            verdict = reading.frame.check(reading.buffer)
        except Exception as exc:  # a bug here must not stop the event loop, nor print a traceback
            self.log.error("cannot frame a request from %s: %r", conn.client, exc)
            self._close(conn)
            return True
        if verdict is Verdict.WHOLE:
            self._hand_on(conn, reading)
            return True
        if isinstance(verdict, Refusal):
            self._refuse(conn, reading, verdict)
            return True
        if reading.frame.expects_continue and reading.frame.waits_for_body and not reading.sent_continue:
            reading.sent_continue = True
            self._send(conn, CONTINUE_100)
        return False

    def _register(self, conn: Any, reading: _Reading) -> None:
        if not reading.registered:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
            reading.registered = True

    def _unregister(self, conn: Any, reading: _Reading) -> None:
        if reading.registered:
            reading.registered = False
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)

    def _hand_on(self, conn: Any, reading: _Reading) -> None:
        """Answer the whole request at the door if the app's door does; else give it (and any bytes read behind
        it) to the thread pool, gthread's way."""
        if self._answered_at_door(conn, reading):
            return
        self._unregister(conn, reading)
        del self._reading[conn]
        conn.parser.unreader.unread(bytes(reading.buffer))
        conn.data_ready = True  # gthread's thread would otherwise wait for the socket to turn readable
        conn.sent_continue = reading.sent_continue
        self._submit(conn)

    def _submit(self, conn: Any) -> None:
        with self._pool_lock:
            self._in_pool += 1
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        self._handling.in_pool = True
        try:
            return super().handle(conn)
        finally:
            self._leave_pool()

    def _leave_pool(self) -> None:
        """Count this thread's request out of the pool, once: as soon as the app has answered it (before gunicorn
        writes the answer, so that the client's next request never finds it still counted), else when the thread
        is done with the connection."""
        if getattr(self._handling, "in_pool", False):
            self._handling.in_pool = False
            with self._pool_lock:
                self._in_pool -= 1

    # --- the door: answers from the event loop (api.door) ----------------------------------------------------

    def _answered_at_door(self, conn: Any, reading: _Reading) -> bool:
        """Ask the app's door for an answer to this request now; send it and return True if there is one."""
        frame = reading.frame
        span = frame.body_span
        if self.door is None or span is None or frame.method != DOOR_METHOD or frame.path != DOOR_PATH:
            return False
        try:
            body = self.door.answer(bytes(reading.buffer[span[0]:span[1]]), conn.accepted_at,
                                    pool_full=self._in_pool >= self.pool_cap)
        except Exception as exc:  # a bug at the door: a thread serves the request, as without one
            self.log.error("the door failed on a request from %s: %r", conn.client, exc)
            return False
        if body is None:
            return False
        keep_alive = (frame.keep_alive and self.alive and self.cfg.keepalive
                      and len(self.keepalived_conns) < self.max_keepalived)
        response = _response(b"200 OK", body, keep_alive)
        if not keep_alive:
            self._send_and_close(conn, reading, response)
            return True
        self._unregister(conn, reading)
        del self._reading[conn]
        if not self._send(conn, response, whole=True):
            return True
        read_ahead = bytes(reading.buffer[span[1]:])
        if read_ahead:
            # The client's next request is already here: read it on the event loop's next pass, as if it had just
            # arrived (not now: a client pipelining hundreds would nest a call per request here).
            conn.parser.unreader.unread(read_ahead)
            self.method_queue.defer(self.enqueue_req, conn)
        else:  # kept alive, waiting for the next request, as gthread keeps a connection after a thread's answer
            conn.set_timeout()
            self.keepalived_conns.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn))
        return True

    def _refuse(self, conn: Any, reading: _Reading, refusal: Refusal) -> None:
        """Answer an error from the event loop and close (`_send_and_close`)."""
        self.log.info("refused a request before the app: %s %s (%s)", refusal.status, refusal.detail, conn.client)
        if self.metrics is not None:
            self.metrics.request_refused(refusal.status)
        self._send_and_close(conn, reading, refusal.response())

    def _send_and_close(self, conn: Any, reading: _Reading, response: bytes) -> None:
        """Send an answer from the event loop and half-close; close when the client does or at the deadline.

        Closing at once, with the client's unread bytes in the socket, would make the kernel reset the
        connection and the client could lose the answer (RFC 9112 section 9.6).
        """
        reading.closing = True
        reading.buffer.clear()
        reading.deadline = time.monotonic() + self.read_timeout_s  # the latest deadline: the order holds
        self._reading.move_to_end(conn)
        if not self._send(conn, response):
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._register(conn, reading)

    def _send(self, conn: Any, data: bytes, whole: bool = False) -> bool:
        """Send a short answer without blocking (a socket's buffer takes it whole unless the client stopped reading
        with answers pending); False if the connection is closed, also when `whole` and only part was sent."""
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return False
        if whole and sent < len(data):
            self._close(conn)  # a kept-alive connection must not carry a cut answer
            return False
        return True

    def _close(self, conn: Any) -> None:
        reading = self._reading.pop(conn, None)
        if reading is not None:
            self._unregister(conn, reading)
        self.nr_conns -= 1
        conn.close()  # TConn.close swallows OSError

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        while self._reading:
            conn, reading = next(iter(self._reading.items()))
            if reading.deadline > now:
                break
            if not reading.closing:
                self.log.debug("closed %s: its request was not whole within %s s", conn.client, self.read_timeout_s)
                if self.metrics is not None:
                    self.metrics.read_timed_out()
            self._close(conn)

    # --- the accept stamp ------------------------------------------------------------------------------------

    def handle_request(self, req: Any, conn: Any) -> bool:
        if getattr(conn, "sent_continue", False):
            req._expected_100_continue = False  # the event loop sent it; gunicorn would send a second one
            conn.sent_continue = False
        self._handling.accepted_at = getattr(conn, "accepted_at", None)
        try:
            return super().handle_request(req, conn)
        finally:
            self._handling.accepted_at = None

    def _with_stamp(self, app: WsgiApp) -> WsgiApp:
        """Wrap `app` so that each request's environ carries its thread's accept stamp, and its answer leaves the pool's
        count as soon as the app has made it."""
        handling, leave_pool = self._handling, self._leave_pool

        def app_with_stamp(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            stamp = getattr(handling, "accepted_at", None)
            if stamp is not None:
                environ[ACCEPTED_AT_KEY] = stamp
            try:
                return app(environ, start_response)
            finally:
                leave_pool()

        return app_with_stamp

