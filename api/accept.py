"""When a request's budget starts: when gunicorn's worker started reading it, passed to the view in the WSGI environ.

The judge's timeout runs from when it sent the request, but a request can wait in the server before its view
starts: while its bytes trickle in, for a free thread of the pool, for the GIL while batches run. Counting the
budget from the view's start would hide that wait and answer late. `server.worker.ReadingThreadWorker` stamps each
request with `time.monotonic()` when its worker's event loop starts reading it, which is the earliest moment the
server knows of it:

- every request, on a new connection or a kept-alive one alike: when its first bytes arrive (a client that opens
  its connection early and sends later has spent none of its budget: the judge's clock, and the client's, start
  when it sends), or when the event loop takes it up if its bytes were already read (behind a previous request,
  or before the connection reached the event loop).

The event loop reads the request whole before any thread sees it, so the time to read it counts, and so does the
wait for a thread after it. (The wait in the kernel's accept queue before that is not seen by any user-space
server, and is not counted.) The stamp travels in the environ under `ACCEPTED_AT_KEY`, a key no client can set
(request headers arrive as `HTTP_*`). Without it (Flask's development server, the test client) the view's own
start is the budget's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# time.monotonic() of the serving process, in seconds.
ACCEPTED_AT_KEY = "esun.accepted_at"


def budget_start(environ: Mapping[str, Any], view_start: float) -> float:
    """Return when the request's budget started: its accept stamp if it has a sane one, else `view_start`."""
    stamp = environ.get(ACCEPTED_AT_KEY)
    # Only the worker sets it, in the same process and clock; anything else (a future time, a string) is a bug.
    if isinstance(stamp, float) and stamp <= view_start:
        return stamp
    return view_start
