"""gunicorn's gthread worker, reading each request whole in its event loop before a thread serves it.

server/gunicorn_conf.py names `ReadingThreadWorker` as `worker_class`. Four additions to gthread:

- **Slow clients never hold a thread.** gthread hands a connection to a thread as soon as it is accepted (or a
  kept-alive one turns readable), and the thread blocks reading the request: as many stalled clients as threads
  stopped the service. Here the event loop (gthread's poller, the main thread) reads each request without blocking
  until it is whole (`server.framing.RequestReader`, llhttp), then hands it on; the thread's parser reads the buffered
  bytes. A request not whole within `REQUEST_READ_TIMEOUT_S` is closed unanswered; one the service would refuse anyway
  (a body over `MAX_BODY_BYTES`, a head over 32 KiB, framing HTTP/1.1 forbids) gets the app's JSON error at once, and
  what gunicorn's parser refuses after it the same JSON body (`server.framing.JsonErrorPages`).
- **The accept stamp** (api.accept): each request's `environ[ACCEPTED_AT_KEY]`, the `time.monotonic()` when its
  first bytes reached the event loop.
- **An answer in one write.** gunicorn's `Response` writes a thread's answer in two `sendall` calls, its head and
  then its body (`server.one_write`). A replica killed between the two left nginx a head without its body, already
  passed to nginx's client, too late to send the request to another replica (issue 40: one broken answer in six
  kills under load). Held and sent together, an answer leaves whole or not at all; nginx passes an unsent one on.
- **The door**: before handing a whole `POST /inference` to the pool, the event loop asks the app's answer policy
  (`api.answers.AnswerPolicy.at_door`), which answers it at once (TOP1, or an answer already computed) when the
  admission (`api.admission`) would keep it from the model. The pool's count (`Admission.enter_pool` / `leave_pool`)
  goes up when the event loop hands a request on and down when the app has answered it (before the answer is
  written: a closed-loop client's next request must not find its own last one still counted).

Every log line of the worker (the app's and gunicorn's) goes through the process's log writer (`sidecar.log_writer`),
started after the fork (`sidecar.lifecycle.start`): none waits for stderr on the event loop or a request's thread.

Everything comes from the app's `api.state.AppState`; an app not built by `api.create_app` is served by plain gthread.
gthread documents no extension point but `get_thread_pool()`, so this class overrides and reads the internals named in
`GTHREAD_INTERNALS` (gunicorn 27.0.1, pinned; tests/server/test_gthread_internals.py fails when one moves), and holds
its idle connections in `server.kept_alive.KeptAlive`. Not read here: TLS, HTTP/2, PROXY (all off in `make run`).
"""

from __future__ import annotations

import contextlib
import select
import selectors
import socket
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from api.accept import ACCEPTED_AT_KEY
from api.state import AppState, serving_state
from server.framing import JsonErrorPages, Refusal, RequestReader, Verdict
from server.kept_alive import KeptAlive
from server.one_write import WsgiApp, in_one_write
from server.open_files import fitted_connections
from sidecar import lifecycle

# One recv() from the event loop: a whole request of the service's size limit in one or two calls.
RECV_BYTES = 64 * 1024
# What this module relies on in gunicorn 27.0.1's gthread, besides the documented worker interface: methods it
# overrides or calls, and attributes it reads, by owner (tests/server/test_gthread_internals.py).
GUNICORN_VERSION = "27.0.1"
GTHREAD_INTERNALS = {
    "ThreadWorker methods": ("enqueue_req", "murder_pending", "handle", "handle_request", "set_accept_enabled",
                             "accept", "on_client_socket_readable", "init_process", "load_wsgi", "handle_error"),
    "ThreadWorker attributes": ("poller", "keepalived_conns", "max_keepalived", "nr_conns", "method_queue",
                                "worker_connections", "alive", "sockets", "wsgi"),
    "TConn attributes": ("sock", "client", "parser", "data_ready", "is_http2", "set_timeout", "close"),
    "Unreader methods": ("take_buffered", "unread"),
    "Request attributes": ("_expected_100_continue",),
    # read by _reads_requests / _start_reading
    "gunicorn functions": ("http2.negotiation.prior_knowledge_allowed", "http2.negotiation.upgrade_allowed",
                           "http.get_parser", "util.write_error"),  # handle_error writes its page with write_error
}
# The other files of the seam list their own: server.one_write.GUNICORN_INTERNALS (the response a thread writes),
# server.gunicorn_logger.GUNICORN_INTERNALS, server/gunicorn_conf.py's GUNICORN_INTERNALS (the master's hooks).


class _Handling(threading.local):
    """What a thread of the pool is doing: whether its request still counts in the pool, and its accept stamp."""

    in_pool = False
    accepted_at: float | None = None


@dataclass(eq=False)
class _Reading:
    """A connection whose request the event loop is reading: its reader, and when it must be whole."""

    reader: RequestReader
    deadline: float
    registered: bool = False
    closing: bool = False  # answered by the event loop with "Connection: close"; waiting for the client to close


class ReadingThreadWorker(ThreadWorker):
    """gthread that hands a request to its thread pool only once read whole, stamped when its reading started."""

    def init_process(self) -> None:
        self.state: AppState | None = None  # the app's, once loaded (load_wsgi)
        self._reading: OrderedDict[Any, _Reading] = OrderedDict()  # in deadline order: deadlines only grow
        self._accepted_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._continued: weakref.WeakSet[Any] = weakref.WeakSet()  # the event loop sent their 100 Continue
        self._handling = _Handling()
        self._reads_plain = self._h2c = False  # until the app is loaded (load_wsgi)
        self.keepalived_conns = KeptAlive()  # gthread's deque, with O(1) removal (server.kept_alive)
        self._fit_open_file_limit()
        # Here, after the fork: no log line of the worker waits for stderr (sidecar.log_writer.LogWriter; stopped at
        # the worker's exit, server/gunicorn_conf.py worker_exit).
        lifecycle.start()
        super().init_process()  # loads the app (load_wsgi), then runs the event loop until the worker stops

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.state = serving_state(self.wsgi)
        cfg = self.cfg  # the settings `_reads_requests` needs, read once (each is a lookup in gunicorn's Config)
        self._reads_plain = self.state is not None and not (
            cfg.is_ssl or cfg.protocol != "http" or cfg.proxy_protocol != "off")
        self._h2c = cfg.http2_cleartext != "off"  # else neither HTTP/2 cleartext mechanism applies to any peer
        if self.state is not None:
            # Flask's documented place for WSGI middleware: `self.wsgi` stays the Flask app.
            self.wsgi.wsgi_app = self._with_stamp(self.wsgi.wsgi_app)

    def _fit_open_file_limit(self) -> None:
        """Raise the open-file limit, or lower `worker_connections` to fit it (server.open_files)."""
        fitted = fitted_connections(self.worker_connections, self.cfg.threads, self.log)
        if fitted is not None:
            self.worker_connections = fitted
            self.max_keepalived = fitted - self.cfg.threads

    # --- reading requests in the event loop ------------------------------------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        """gthread's one door into the thread pool (accept, a kept-alive connection turning readable, bytes of a
        next request read behind the last): stamp the connection and read its request first."""
        now = time.monotonic()
        self._accepted_at[conn] = now
        if not self._reads_requests(conn):
            self._submit(conn)
            return
        try:
            self._start_reading(conn, now)
        except Exception as exc:  # gthread's accept() would stop the worker on it; close this connection alone
            self.log.error("cannot read a request from %s: %r", conn.client, exc)
            self._close(conn)

    def _reads_requests(self, conn: Any) -> bool:
        """Whether the event loop reads this connection's requests (plain HTTP/1.x of our app, as `make run`)."""
        return self._reads_plain and not (conn.is_http2 or self._h2c and (
            negotiation.prior_knowledge_allowed(self.cfg, conn.client)
            or negotiation.upgrade_allowed(self.cfg, conn.client)))

    def _start_reading(self, conn: Any, now: float) -> None:
        assert self.state is not None
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        if conn.sock.gettimeout() != 0.0:  # a thread left it blocking (bytes of a next request were read ahead)
            conn.sock.setblocking(False)
        reading = _Reading(RequestReader(self.state.config.max_body_bytes),
                           now + self.state.config.request_read_timeout_s)
        self._reading[conn] = reading
        buffered = conn.parser.unreader.take_buffered()
        if not (buffered and self._advance(conn, reading, buffered)):
            self._receive(conn, reading)

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
        if not reading.reader.buffer:  # the request's first bytes: its clock starts now (api.accept)
            self._accepted_at[conn] = time.monotonic()
        if not self._advance(conn, reading, data):
            self._register(conn, reading)

    def _advance(self, conn: Any, reading: _Reading, data: bytes) -> bool:
        """Feed the bytes; hand the request on, refuse it, or say it needs more bytes (False)."""
        try:
            verdict = reading.reader.feed(data)
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
        if reading.reader.expects_continue and conn not in self._continued:
            self._continued.add(conn)
            self._send(conn, reading.reader.continue_100())
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
        """Answer the whole request at the door if the answer policy does; else give it (and any bytes read behind
        it) to the thread pool, gthread's way."""
        if self._answered_at_door(conn, reading):
            return
        self._unregister(conn, reading)
        del self._reading[conn]
        conn.parser.unreader.unread(bytes(reading.reader.buffer))
        conn.data_ready = True  # gthread's thread would otherwise wait for the socket to turn readable
        self._submit(conn)

    def _submit(self, conn: Any) -> None:
        if self.state is not None:
            self.state.admission.enter_pool()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        """gthread's thread: counts the request out of the pool if the app did not (an error before the app)."""
        self._handling.in_pool = self.state is not None
        try:
            return super().handle(conn)
        finally:
            self._leave_pool()

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        super().handle_error(req, JsonErrorPages(client), addr, exc)  # gunicorn's own refusals, as JSON too

    def _leave_pool(self) -> None:
        """Count this thread's request out of the pool, once."""
        if self._handling.in_pool and self.state is not None:
            self._handling.in_pool = False
            self.state.admission.leave_pool()

    # --- the door: answers from the event loop ---------------------------------------------------------------

    def _answered_at_door(self, conn: Any, reading: _Reading) -> bool:
        """Ask the answer policy for an answer to this request now; send it and return True if there is one."""
        reader = reading.reader
        if self.state is None or reader.method != b"POST" or reader.path != b"/inference":
            return False
        try:
            body = self.state.answers.at_door(bytes(reader.body), self._accepted_at.get(conn, time.monotonic()))
        except Exception as exc:  # a bug at the door: a thread serves the request, as without one
            self.log.error("the door failed on a request from %s: %r", conn.client, exc)
            return False
        if body is None:
            return False
        keep_alive = (reader.keep_alive and self.alive and self.cfg.keepalive
                      and len(self.keepalived_conns) < self.max_keepalived)
        response = reader.response(200, body, keep_alive)
        if not keep_alive:
            self._send_and_close(conn, reading, response)
            return True
        self._unregister(conn, reading)
        del self._reading[conn]
        if not self._send(conn, response, whole=True):
            return True
        read_ahead = bytes(reader.buffer[reader.end:])
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
        if self.state is not None:
            self.state.metrics.request_refused(refusal.status)
        self._send_and_close(conn, reading, reading.reader.refusal_response(refusal))

    def _send_and_close(self, conn: Any, reading: _Reading, response: bytes) -> None:
        """Send an answer and half-close; close when the client does or at the deadline (closing at once, with the
        client's unread bytes in the socket, would make the kernel reset it and lose the answer: RFC 9112 9.6)."""
        assert self.state is not None
        reading.closing = True
        reading.deadline = time.monotonic() + self.state.config.request_read_timeout_s  # the latest: order holds
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
        """gthread's run loop calls it after every pass (at least once a second): also close the connections whose
        request was not whole in time."""
        super().murder_pending()
        now = time.monotonic()
        while self._reading:
            conn, reading = next(iter(self._reading.items()))
            if reading.deadline > now:
                break
            if not reading.closing:
                self.log.debug("closed %s: its request was not whole in time", conn.client)
                if self.state is not None:
                    self.state.metrics.read_timed_out()
            self._close(conn)

    # --- the accept stamp, and a stop that refuses new connections ------------------------------------------

    def handle_request(self, req: Any, conn: Any) -> bool:
        if conn in self._continued:
            req._expected_100_continue = False  # the event loop sent it; gunicorn would send a second one
            self._continued.discard(conn)
        self._handling.accepted_at = self._accepted_at.get(conn)
        try:
            return super().handle_request(req, conn)
        finally:
            self._handling.accepted_at = None

    def _with_stamp(self, app: WsgiApp) -> WsgiApp:
        """Wrap `app` so that each request's environ carries its accept stamp, its answer leaves the pool's count as
        soon as the app has made it, and is written in one call (`in_one_write`)."""
        handling, leave_pool = self._handling, self._leave_pool

        def app_with_stamp(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            stamp = handling.accepted_at
            if stamp is not None:
                environ[ACCEPTED_AT_KEY] = stamp
            try:
                return app(environ, start_response)
            finally:
                leave_pool()

        return in_one_write(app_with_stamp)

    def set_accept_enabled(self, enabled: bool) -> None:
        """On stop, take the connections already queued, then close the listeners.

        gthread stops accepting on SIGTERM but keeps its listening sockets open while it drains, and closes them only
        on exit: the kernel goes on completing connections nobody will accept, and resets them all at the close.
        Closing at once makes later connects fail fast with "refused"; those already queued are served.
        """
        if enabled or self.alive:
            super().set_accept_enabled(enabled)  # start, or the connection limit was reached: not a stop
            return
        for listener in self.sockets:
            while select.select([listener], [], [], 0)[0]:
                self.accept(listener)
        super().set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()
