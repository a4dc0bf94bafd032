"""Tiny HTTP servers in a thread of the test, to drive the load generators without gunicorn or a model.

`serving(mode)` starts one on a free loopback port and yields its base URL:
- "answer": answers POST /inference with the service's four keys, the esun_uuid echoed (keep-alive, HTTP/1.1);
- "unavailable": answers every request with a 503 JSON error;
- "silent": accepts connections and reads, never answers;
- "cut": reads a request, sends half a status line, closes the connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "answer"
    served: list[str]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        esun_uuid = json.loads(body).get("esun_uuid", "")
        self.served.append(esun_uuid)
        if self.mode == "unavailable":
            self._send(503, {"error": "unavailable", "detail": "test server"})
        else:
            self._send(200, {"esun_uuid": esun_uuid, "server_uuid": "s", "server_timestamp": 1.0, "answer": "好"})

    def _send(self, status: int, data: dict[str, object]) -> None:
        payload = json.dumps(data, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # quiet: the test reads what was served from `served`


@contextlib.contextmanager
def serving(mode: str = "answer") -> Iterator[tuple[str, list[str]]]:
    """Serve in a thread on a free loopback port; yield the base URL and the esun_uuids served so far."""
    if mode in ("silent", "cut"):
        with _raw_server(mode) as url:
            yield url, []
        return
    served: list[str] = []
    handler = type("Handler", (_Handler,), {"mode": mode, "served": served})
    # socketserver listens with a backlog of 5: the slow-client test's 20 connections, opened at once on a busy
    # machine, overflowed it and a client's SYN waited a second for its retry; gunicorn's backlog is 2048
    server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128})
    server = server_class(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _raw_server(mode: str) -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            if mode == "cut":
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 2")
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def closed_port() -> str:
    """Return the base URL of a loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def never_accepting() -> Iterator[str]:
    """Listen with the smallest queue and never accept: past the first connections, connects hang (SYN retries)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
