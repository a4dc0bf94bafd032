"""The worker's open-file limit, fitted to the connections it holds: past the limit accept() fails with EMFILE, which
gthread treats as fatal, and many shells start at 1,024 (server.worker calls `fitted_connections` at its start)."""

from __future__ import annotations

import resource
from typing import Any

# File descriptors the worker needs besides its client connections: listeners, pipes, logs, the model's files.
RESERVED_FILES = 256


def fitted_connections(worker_connections: int, threads: int, log: Any) -> int | None:
    """Raise the soft open-file limit to the hard one if `worker_connections` needs more; if it still falls short,
    the connections that fit it (a warning on `log`, gunicorn's logger, each time), else None: no change."""
    needed = worker_connections + threads + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %s to %s: %s", soft, hard, exc)
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitted = max(soft - threads - RESERVED_FILES, threads + 1)
        log.warning("open-file limit %s: worker_connections lowered from %s to %s", soft, worker_connections, fitted)
        return fitted
    return None
