"""gunicorn settings: `gunicorn -c server/gunicorn_conf.py "api:create_app()"` (what `make run` does).

`Config.workers` worker processes (WEB_WORKERS; by default one per core, each with one torch thread), each
with its own thread pool, admission, batcher and model: one process's GIL caps what it serves (reading requests,
JSON, features, the language model), so a machine's cores are used only by several. Each worker batches the share
of the traffic the kernel hands it. Many threads per worker, because each waiting request holds one and a batch
fills only when at least `max_batch_size` requests wait at once. With several workers, the master makes a folder
they share (`shared_dir`): a retry finds the answer its first attempt got in whichever worker took it
(cache.sqlite_cache, unless REDIS_URL is set), and `/metrics` shows every worker's series (api.metrics).

The master never initializes CUDA: it would leave every forked worker unable to (`machine.check_device` asks in a
child process, and the preload touches no device).
"""

from __future__ import annotations

import atexit
import errno
import importlib
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

# gunicorn executes this file by path; make the repository importable for `config` (and the app).
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from config import Config, ConfigError  # noqa: E402
from machine import check_device, check_workers  # noqa: E402
from model.contract import check_weights, ignored_masked_lm  # noqa: E402
from sidecar.shared_dir import make_shared_dir, remove_shared_dir  # noqa: E402

_made_shared_dir = ""  # the folder this master made for its workers, removed at exit (on_exit)


def _remove_made_shared_dir(master_pid: int) -> None:
    if os.getpid() == master_pid:
        remove_shared_dir(_made_shared_dir)


try:
    _config = Config.from_env()
    # Before any fork: a worker count the machine's memory cannot hold stops here (a warning for more than its cores).
    _warnings = [check_workers(_config), *Config.misspelled(os.environ)]
    check_device(_config)
    _warnings.append(ignored_masked_lm(_config, check_weights(_config)))
    if _config.workers > 1 and not _config.shared_dir:
        # Made here, at the config's first reading and after every check (a refused start leaves no folder), so that
        # every worker's Config.from_env reads the same folder.
        _made_shared_dir = os.environ["SHARED_DIR"] = make_shared_dir()
        # A start that fails after this (the port in use, an app that does not import) never reaches on_exit. The
        # master's pid: a worker forked from it runs the interpreter's exit handlers too, and must not remove it.
        atexit.register(_remove_made_shared_dir, os.getpid())
        _config = Config.from_env()
except ConfigError as exc:
    # gunicorn reports any exception from this file as "Failed to read config file" and a traceback, but lets
    # SystemExit through: one line naming the setting, JSON as every line of the server's, and a non-zero status.
    from sidecar.log_writer import json_line

    print(json_line(time.time(), "ERROR", "config", f"config error: {exc}", {}), file=sys.stderr)
    sys.exit(2)
for _warning in filter(None, _warnings):
    from sidecar.log_writer import json_line

    print(json_line(time.time(), "WARNING", "config", _warning, {}), file=sys.stderr)

bind = f"{_config.host}:{_config.port}"
workers = _config.workers
# gthread that reads each request whole in its event loop before a thread serves it, with the time that reading
# started in its WSGI environ: the start of its budget (server.worker, api.accept).
worker_class = "server.worker.ReadingThreadWorker"
threads = _config.threads
# Connections the worker holds at once (gthread's default is 1,000), threads' and event loop's together. A
# connection waiting for its request costs no thread here (server.worker reads requests in the event loop), so the
# cap is only memory and file descriptors: 1,000 slow clients held open (at most REQUEST_READ_TIMEOUT_S each)
# leave room for the judge. At the cap the worker stops accepting and new connections wait in the kernel's
# queue. The worker raises its open-file limit to fit (server.worker).
worker_connections = 4096
# The app is built in the worker, after the fork: its threads (batcher, model loader) do not survive one.
preload_app = False
# gunicorn takes whole seconds; rounding down would turn 0.5 into 0, which means "no timeout" for `timeout`.
timeout = math.ceil(_config.worker_timeout_s)
graceful_timeout = math.ceil(_config.graceful_timeout_s)
# How long an idle kept-alive connection stays open. A client that reuses a connection the server is closing at
# that very moment gets a reset, which the judge scores as no answer: clients' pools keep idle connections far
# longer than gunicorn's default 5 s (requests/urllib3: no limit), so 75 s as nginx's default. An idle
# connection costs no thread (the worker's event loop watches it), only a file descriptor of worker_connections.
keepalive = 75
loglevel = _config.log_level.lower()
accesslog = None  # the app writes one JSON line per request itself
# gunicorn's logger turns its access line on whenever logconfig_dict is given, even with accesslog = None: every
# request was logged twice, at a measured cost (server.gunicorn_logger.GunicornLogger); this one writes it only when
# asked.
logger_class = "server.gunicorn_logger.GunicornLogger"
# gunicorn's own lines as JSON too, on stderr beside the app's (sidecar.log_writer), with the process id (master or
# worker). The root logger gets no handler (gunicorn's default would print the app's lines a second time, as plain
# text).
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING", "handlers": []},
    "loggers": {
        "gunicorn.error": {"level": _config.log_level, "handlers": ["json"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["json"], "propagate": False},
    },
    # Through the process's log writer, never waiting for stderr (sidecar.log_writer.LogWriter).
    "handlers": {"json": {"class": "sidecar.log_writer.StderrHandler", "formatter": "json"}},
    "formatters": {"json": {"()": "sidecar.log_writer.JsonFormatter", "with_pid": True}},
}
# What the master's hooks here read of gunicorn 27.0.1 beyond its documented settings (tests/server/
# test_gthread_internals.py reads this literal without running the file): on_starting's `server.app.app_uri`.
GUNICORN_INTERNALS = {"Application attributes": ("app_uri",)}
# No control socket (gunicornc is not used): by default gunicorn 27 opens one at ~/.gunicorn/gunicorn.ctl, which a
# second instance on another port takes over, and deletes when it exits.
control_socket_disable = True


def on_starting(server: Any) -> None:
    """Import and warm up in the master, before the port opens, what each worker would otherwise do first.

    Then a worker, the first or one replacing a dead one, answers within milliseconds of its fork, while the
    model loads on a thread of it (hosting.loading); importing torch there would also stall its answers (an import
    holds the GIL for up to half a second at a time). The shipped model's modules are imported only for the
    shipped app (`api:...`): apps around fakes start without torch.
    """
    stop_if_port_taken(server)
    from api import preload
    from sidecar import lifecycle

    # The master's own lines (a worker booted, killed, timed out) never wait for stderr either: a master stuck in a
    # write() to a pipe nobody reads would never replace a dead worker. Its log writer's thread is not forked into the
    # workers (each starts its own, server.worker); stopped in on_exit.
    lifecycle.start()

    module = server.app.app_uri.partition(":")[0]
    preload(with_model=module == "api", config=_config)
    importlib.import_module(module)


def stop_if_port_taken(server: Any) -> None:
    """Stop at once, in one log line, when another process listens on a port to bind (a second `make run`).

    gunicorn itself would try five times a second apart, logging two errors each time, after the master's warm-up:
    11 s and ten lines to say it. The probe binds as gunicorn does (SO_REUSEADDR: a port that only lingers after
    its last server is free) and closes at once. Sockets handed over (a USR2 re-exec, systemd) are not bound here.
    """
    if "GUNICORN_FD" in os.environ or "LISTEN_FDS" in os.environ:
        return
    for address in server.cfg.address:
        if not isinstance(address, tuple):  # a unix socket path: gunicorn reports it
            continue
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                continue  # anything else gunicorn reports as it binds
            server.log.error("port %s is in use on %s: another server listens there (a second make run?); stop it "
                             "or set PORT to another port", address[1], address[0] or "all addresses")
            sys.exit(1)


def post_worker_init(worker: object) -> None:
    """Start what the app runs beside its requests (its metrics spool: `api.state.AppState.starting`, as
    `python -m api` does), once the worker has built it (sidecar.lifecycle.start)."""
    from server.worker import ReadingThreadWorker
    from sidecar import lifecycle

    state = worker.state if isinstance(worker, ReadingThreadWorker) else None
    lifecycle.start(*(() if state is None else state.starting()))


def worker_exit(server: object, worker: object) -> None:
    """Close the app's objects in their order (the model host, the cache's queued shared writes, the metrics' spool:
    `api.state.AppState.closing`, as `python -m api` does), then write the queued log lines, when the worker stops
    (sidecar.lifecycle.stop)."""
    from server.worker import ReadingThreadWorker
    from sidecar import lifecycle

    state = worker.state if isinstance(worker, ReadingThreadWorker) else None
    lifecycle.stop(*(() if state is None else state.closing()))


def on_exit(server: object) -> None:
    """Remove the folder the master made for its workers (a folder named in SHARED_DIR is the user's: kept), then
    write the master's queued log lines (sidecar.lifecycle.stop)."""
    from sidecar import lifecycle

    lifecycle.stop(shared_dir=_made_shared_dir)
