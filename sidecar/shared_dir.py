"""The folder a gunicorn master makes for its workers when they are several and SHARED_DIR names none: the answer
cache's SQLite file (cache.sqlite_cache) and the metrics spool (sidecar.metrics_spool) live there. Made by the
master at its config's first reading (server/gunicorn_conf.py), removed at its exit (`sidecar.lifecycle.stop`); a
folder the user named in SHARED_DIR is the user's, never removed."""

from __future__ import annotations

import shutil
import tempfile

PREFIX = "esun-shared-"


def make_shared_dir() -> str:
    """Make a new folder for the workers to share, in the system's temporary folder, and return its path."""
    return tempfile.mkdtemp(prefix=PREFIX)


def remove_shared_dir(folder: str) -> None:
    """Remove a folder `make_shared_dir` made, with everything in it; what cannot be removed is left."""
    shutil.rmtree(folder, ignore_errors=True)
