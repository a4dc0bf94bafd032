"""The HTTP routes. `/inference` reads as the chain of one request:

`schemas.parse_request` → `answers.in_view` (the rules without the model, `admission.refusal`, then
`batcher.submit(nbest, deadline)` ⇒ worker: `corrector.predict_batch`) → `answers.respond` (`schemas.build_response`,
one log line, the request's metrics). The deadline counts from the request's accept (`api.accept`), not from the
view's start; the time between the two is what the overload control watches.
"""

from __future__ import annotations

import functools
import json
import time
import tomllib
from typing import Any

from flask import Flask, g, redirect, request
from spectree import Response, SpecTree
from werkzeug.wrappers import Response as WerkzeugResponse

from api import schemas
from api.accept import budget_start
from api.errors import PayloadTooLarge
from api.logs import log_writer_trouble
from api.metrics import metrics_view
from api.state import app_state
from config import REPO_ROOT
from hosting.interfaces import Engine


def inference() -> dict[str, Any]:
    """Answer one question of the judge: the corrected sentence, or TOP1 when the model cannot in time."""
    view_start = time.monotonic()
    accepted_at = budget_start(request.environ, view_start)
    state = app_state()
    req = schemas.parse_request(read_body(state.config.max_body_bytes), state.config)
    g.esun_uuid = req.esun_uuid
    outcome = state.answers.in_view(req, accepted_at, view_start)
    g.answered = True  # counted by the answer's path (api.answers), not as rejected (api.metrics.instrument)
    return state.answers.respond(req, outcome, accepted_at, view_start)


def read_body(max_body_bytes: int) -> bytes:
    """Read the raw body whatever its Content-Type (the judge's template used get_json(force=True))."""
    body = request.get_data(cache=False)
    # werkzeug refuses a Content-Length over MAX_CONTENT_LENGTH (max_body_bytes + 1, api.app) and cuts a streamed
    # (chunked) body there without saying so: a body over the limit is this long, by Content-Length or chunked alike.
    # (Under gunicorn the worker's framing refuses it first, server.framing; this acts under werkzeug's server.)
    if len(body) > max_body_bytes:
        raise PayloadTooLarge(f"body must be under {max_body_bytes} bytes")
    return body


def healthz() -> dict[str, str]:
    """Tell that the process is alive (it may not be ready)."""
    return {"status": "ok"}


def readyz() -> tuple[dict[str, Any], int]:
    """Tell whether the service can answer with the model (corrector loaded and set up, batcher running) and write
    its log (the log writer not stuck: answers go on, their lines dropped)."""
    state = app_state()
    reasons = []
    if (trouble := state.host.trouble()) is not None:
        reasons.append(trouble)
    if not state.engine.alive():
        reasons.append(engine_trouble(state.engine))
    if (trouble := log_writer_trouble()) is not None:
        reasons.append(trouble)
    return {"ready": not reasons, "reasons": reasons}, 503 if reasons else 200


def engine_trouble(engine: Engine) -> str:
    """Say why the engine is not alive: a batch running too long, or no worker running."""
    snapshot = engine.stats()
    if snapshot.worker_alive and snapshot.running_for_s > 0:
        return f"a batch has been running for {snapshot.running_for_s:.1f} s"
    return "batcher worker is not running"


def index() -> dict[str, Any]:
    """Describe the service: name, version, model, the weights folder this worker serves (hosting.swap) and settings."""
    state = app_state()
    name, version = _project()
    model = state.engine.describe() if state.corrector is None else state.corrector.info
    serving = state.host.describe()
    return {"name": name, "version": version, "model": _json_safe(model),
            "serving": _json_safe(serving) if serving is not None else None, "config": state.config.summary()}


def docs() -> WerkzeugResponse:
    """Send a browser to the Swagger UI of /openapi.json."""
    return redirect("/docs/swagger/")


def register_routes(app: Flask) -> SpecTree:
    """Add the routes to `app` and document them, from the same schemas, at /openapi.json and /docs."""
    name, version = _project()
    spec = SpecTree(
        "flask", title=name, version=version, path="docs", mode="strict", annotations=False,
        validation_error_status=400, validation_error_model=schemas.ErrorBody,
        description="ASR post-correction for the E.SUN 2022 judge. Request validation is done by "
                    "schemas.parse_request with these same models, whatever the Content-Type.",
    )
    errors = {"HTTP_400": schemas.ErrorBody, "HTTP_413": schemas.ErrorBody, "HTTP_500": schemas.ErrorBody}

    def add(rule: str, view: Any, method: str, error_status: int = 500, **doc: Any) -> None:
        # Validation is ours (parse_request reads the body whatever its Content-Type); spectree documents.
        documented = spec.validate(skip_validation=True, validation_error_status=error_status, **doc)(view)
        app.add_url_rule(rule, view.__name__, documented, methods=[method])

    add("/inference", inference, "POST", error_status=400, json=schemas.InferenceRequest,
        resp=Response(HTTP_200=schemas.InferenceResponse, **errors), tags=["judge"])
    add("/healthz", healthz, "GET", resp=Response(HTTP_200=schemas.HealthBody), tags=["ops"])
    add("/readyz", readyz, "GET", resp=Response(HTTP_200=schemas.ReadyBody, HTTP_503=schemas.ReadyBody),
        tags=["ops"])
    add("/", index, "GET", resp=Response(HTTP_200=schemas.InfoBody), tags=["ops"])
    # Prometheus text, not JSON: documented without a schema (text/plain; version=0.0.4).
    add("/metrics", metrics_view, "GET", resp=Response("HTTP_200"), tags=["ops"])
    spec.register(app)  # /docs/openapi.json, /docs/swagger/, /docs/redoc/, ...
    app.add_url_rule("/openapi.json", "spec_json", lambda: spec.spec)
    app.add_url_rule("/docs", "docs_index", docs, strict_slashes=False)  # /docs/ too
    return spec


@functools.cache
def _project() -> tuple[str, str]:
    """Read the service's name and version from pyproject.toml, the one place they are written."""
    try:
        with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
            project = tomllib.load(fh).get("project", {})
    except OSError:
        project = {}
    return project.get("name", "esun-asr-correction"), project.get("version", "unknown")


def _json_safe(info: Any) -> dict[str, Any]:
    """Make the model's info serialisable whatever it holds (paths, numpy numbers, ...)."""
    return json.loads(json.dumps(dict(info), default=str))
