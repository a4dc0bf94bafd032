"""An answer in one write: gunicorn's `Response` writes a thread's answer in two `sendall` calls, its head and then
its body. A replica killed between the two left nginx a head without its body, already passed to nginx's client,
too late to send the request to another replica (issue 40: one broken answer in six kills under load). Held and sent
together (`in_one_write`, which server.worker wraps the app in), an answer leaves whole or not at all, and one unsent
is passed on by nginx.

What this module relies on in gunicorn 27.0.1's `gunicorn.http.wsgi.Response`, undocumented, is listed in
`GUNICORN_INTERNALS` and pinned by tests/server/test_gthread_internals.py.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# The response a thread writes, reached as start_response's instance: its socket, replaced by `_OneWrite` for the
# answer; the head goes out in send_headers and the body in _emit_body, one sendall each.
GUNICORN_INTERNALS = {
    "Response attributes": ("sock", "start_response"),
    "Response methods": ("send_headers", "_emit_body"),
}


class _OneWrite:
    """The socket of one gunicorn `Response` (gunicorn 27.0.1: `send_headers`, then `_emit_body`, each one `sendall`
    on `Response.sock`): holds the first write, the head, and sends it with the second, the body's first bytes, in
    one call; a response that ends without a body sends its head at `flush`. Everything else goes to the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._head: bytes | None = None
        self._held = True

    def sendall(self, data: bytes) -> None:
        if not self._held:
            self._sock.sendall(data)
        elif self._head is None:
            self._head = bytes(data)
        else:
            self._held = False
            self._sock.sendall(self._head + data)

    def flush(self) -> None:
        """Send a head still held (a response without a body) and stop holding."""
        if self._held and self._head is not None:
            self._sock.sendall(self._head)
        self._held = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Flushed:
    """A WSGI body that sends its response's held head when gunicorn closes it (after the response's own close)."""

    def __init__(self, body: Iterable[bytes], sock: _OneWrite) -> None:
        self._body = body
        self._sock = sock

    def __iter__(self) -> Any:
        return iter(self._body)

    def close(self) -> None:
        try:
            self._sock.flush()
        finally:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()


def in_one_write(app: WsgiApp) -> WsgiApp:
    """Wrap `app` so that gunicorn writes each of its answers, head and body, in one `sendall` (`_OneWrite`)."""

    def app_in_one_write(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        response = getattr(start_response, "__self__", None)  # gunicorn passes its Response's bound method
        sock = getattr(response, "sock", None)
        if sock is None:
            return app(environ, start_response)
        held = response.sock = _OneWrite(sock)
        try:
            body = app(environ, start_response)
        except BaseException:
            held.flush()
            raise
        return _Flushed(body, held)

    return app_in_one_write
