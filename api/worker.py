"""gunicorn's gthread worker, stamping each request with when it was accepted (see api.accept).

api/gunicorn_conf.py names it as `worker_class`; everything else is gthread's own behaviour.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from api.accept import ACCEPTED_AT_KEY

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class StampingThreadWorker(ThreadWorker):
    """gthread, plus `environ[ACCEPTED_AT_KEY]`: the time.monotonic() its request was handed to the thread pool.

    gthread's event loop (one thread) accepts connections and watches kept-alive ones; every request it hands to
    the pool goes through `enqueue_req`, which stamps the connection: a new connection at accept, a kept-alive one
    when its next request's bytes arrive, one that sent nothing for gthread's data timeout when it finally does.
    The request's thread copies the stamp into a thread-local before gthread builds the environ, and a wrapper
    around the app puts it into the environ (gthread offers no hook between the two).
    """

    def init_process(self) -> None:
        self._handling = threading.local()
        super().init_process()  # loads the app (load_wsgi), then runs the event loop until the worker stops

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # Flask's documented place for WSGI middleware is `app.wsgi_app`: `self.wsgi` stays the Flask app, which
        # gunicorn_conf.worker_exit reads its state from.
        if hasattr(self.wsgi, "wsgi_app"):
            self.wsgi.wsgi_app = self._with_stamp(self.wsgi.wsgi_app)
        else:
            self.wsgi = self._with_stamp(self.wsgi)

    def enqueue_req(self, conn: Any) -> None:
        conn.accepted_at = time.monotonic()
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> bool:
        self._handling.accepted_at = getattr(conn, "accepted_at", None)
        try:
            return super().handle_request(req, conn)
        finally:
            self._handling.accepted_at = None

    def _with_stamp(self, app: WsgiApp) -> WsgiApp:
        """Wrap `app` so that each request's environ carries its thread's accept stamp."""
        handling = self._handling

        def app_with_stamp(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            stamp = getattr(handling, "accepted_at", None)
            if stamp is not None:
                environ[ACCEPTED_AT_KEY] = stamp
            return app(environ, start_response)

        return app_with_stamp
