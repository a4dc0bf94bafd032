"""gunicorn's logger class for `make run` (server/gunicorn_conf.py names it as `logger_class`).

gunicorn documents `logger_class` as a setting; the method overridden here is not documented, so it is listed in
`GUNICORN_INTERNALS` and pinned with the worker's gthread internals (tests/server/test_gthread_internals.py).
"""

from __future__ import annotations

from gunicorn.glogging import Logger as GunicornBaseLogger

# What this module relies on in gunicorn 27.0.1, undocumented: the method it overrides.
GUNICORN_INTERNALS = {"Logger methods": ("_compute_access_log_enabled",)}


class GunicornLogger(GunicornBaseLogger):
    """gunicorn's logger, writing an access line only when an access log is asked for (`accesslog`).

    gunicorn turns its access log on whenever a `logconfig_dict` is given (server/gunicorn_conf.py gives one, to
    make its own lines JSON), even with `accesslog = None`: every request was then logged twice, once by gunicorn
    (its atoms built from the whole environ, formatted, written under the handler's lock) and once by the app
    (`log_request`), which is the line that says how the request was answered. Measured on the HTTP path alone
    (a TOP1 answer, wrk -t1 -c64, 4 rounds of 8 s each way): 1,037-1,307 requests/s without gunicorn's line
    against 760-905 with it. For server/gunicorn_conf.py to name as `logger_class`.
    """

    def _compute_access_log_enabled(self) -> bool:
        return bool(self.cfg.accesslog)
