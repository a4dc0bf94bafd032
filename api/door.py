"""Answers given at the door: by gunicorn's event loop itself, before any thread or Flask, when a thread would not help.

Why. A request served by a thread costs about a millisecond of the GIL before its view even starts (waking the
thread, gunicorn's parser, the WSGI environ, Flask's dispatch, the response): about 900 TOP1 answers a second on
the 2-core machine, whatever the model does. Past that rate requests queue for the GIL and their answers, TOP1
included, come late (issue 14: at 3x the closed-loop capacity, 94 % later than 1 s). The worker's event loop
(`api.worker`) already holds every request whole before a thread sees it; reading the question and writing its
TOP1 from there costs about 50 microseconds. The event loop asks the door (`answer`) before handing a request on:

- **the pool is full** (`pool_full`): `POOL_LIMIT` requests are in the thread pool already. Each is a thread
  that contends for the GIL, with the event loop too: with 128 of them, the event loop waited so long for the GIL
  that requests sat unread in their sockets, unseen by the accept stamp, and answers at the deadline reached the
  client after its 1 s. This one is answered now, path `pool_full`.
- **no model slot is free** (`api.overload.OverloadControl.turn_away`): the overload control's limit on model
  requests in flight is reduced and reached (path `shed`), or `max_in_flight` requests wait on the model already,
  so that the batcher would refuse it (path `overload`). The view would answer it TOP1 at once, after a thread
  and Flask; the door gives the same answer without them. A request the model can take goes on to a thread.

Otherwise (`None`) the request goes on to a thread, as does one whose body is not a readable question (the view
answers it with its 400 and JSON error body). An answer at the door is what the view's own guards (`api.guards`)
give without the model, on this replica's local cache (no network call in the event loop): the answer already
computed for the question (`cached`, `retry_cached`), TOP1 for a retry without one (`retry_top1`, as the view
answers every retry), else TOP1 (`pool_full`, `shed`, `overload`). Each is logged and counted like the view's
answers (one request line, `esun_request_duration_seconds{path}`), with its latency from the accept stamp.
"""

from __future__ import annotations

import json
import time

from api import guards
from api.errors import InvalidRequest
from api.logs import log_request
from api.metrics import Metrics
from api.overload import OverloadControl
from api.schemas import build_response, parse_request
from cache.memory import MemoryResultCache
from config import Config

# Where create_app keeps the app's door, for the worker to find (app.extensions).
DOOR_KEY = "asr_correction_door"
# The one route the door answers.
DOOR_METHOD, DOOR_PATH = b"POST", b"/inference"


_REASONS = {
    "pool_full": "POOL_LIMIT requests were in the thread pool: answered by the event loop",
    "shed": "overload control: model work shed while requests queue (answered by the event loop)",
    "overload": "as many questions as the batcher takes wait on the model (answered by the event loop)",
}


class Door:
    """Answers /inference from the worker's event loop when a thread would only delay a TOP1 (module docstring)."""

    def __init__(self, config: Config, overload: OverloadControl, metrics: Metrics,
                 local_cache: MemoryResultCache) -> None:
        self._config = config
        self._overload = overload
        self._metrics = metrics
        self._local_cache = local_cache

    def answer(self, body: bytes, accepted_at: float, pool_full: bool) -> bytes | None:
        """Return the JSON body of a 200 answer given now, or None: a thread serves the request.

        `accepted_at` is the request's accept stamp (time.monotonic(), api.accept); `pool_full` tells that the
        thread pool holds `POOL_LIMIT` requests.
        """
        path = "pool_full" if pool_full else self._overload.turn_away()
        if path is None:
            return None
        try:
            req = parse_request(body, self._config)
        except InvalidRequest:
            return None  # the view answers it with its 400 (a shed counted for it is the only trace)
        # The view's own guards for what is already known (a retry never reaches the model anyway), else TOP1.
        outcome = (guards.answer_retry(req, self._local_cache) or guards.answer_cached(req, self._local_cache)
                   or guards.top1(req, path, reason=_REASONS[path]))
        response = build_response(req.esun_uuid, outcome.answer, self._config, now=time.time())
        latency_s = time.monotonic() - accepted_at
        log_request(req.esun_uuid, req.retry, outcome.path, latency_s * 1000, None, outcome.reason)
        self._metrics.observe_request(outcome.path, latency_s)
        return json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode()
