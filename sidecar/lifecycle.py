"""Where a process starts what it runs beside the request path (the log writer), and where it stops that and the
rest of the sidecar in order (the closers it is handed, the shared folder a master made, then the log writer).

gunicorn's master starts in `on_starting` and stops in `on_exit`; each worker starts after its fork
(`server.worker.ReadingThreadWorker.init_process`) and stops in `worker_exit` (server/gunicorn_conf.py);
`python -m api` starts before serving and stops when it ends. What the app built to run beside its requests (the
metrics spool, `api.state.AppState.starting`) is started here once the app is built (gunicorn's `post_worker_init`,
`python -m api`) and stopped among the closers a worker hands `stop`.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.log_writer import LOG_WRITER
from sidecar.shared_dir import remove_shared_dir


def start(*starting: Callable[[], None]) -> None:
    """Start the process's log writer thread: from now on no log line of the process waits for stderr (once per
    process; a process forked from a started one starts its own with its first line); then each of `starting` in
    turn (an app's metrics spool)."""
    LOG_WRITER.start()
    for begin in starting:
        begin()


def stop(*closing: Callable[[], None], shared_dir: str = "") -> None:
    """Call each of `closing` in turn (a worker's batcher, cache and metrics spool), then remove `shared_dir` (the
    folder a master made for its workers), then write the queued log lines and stop the log writer: that last step
    even when an earlier one raised, which then propagates."""
    try:
        for close in closing:
            close()
        if shared_dir:
            remove_shared_dir(shared_dir)
    finally:
        LOG_WRITER.stop()
