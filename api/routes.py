"""The HTTP routes. `/inference` reads as the chain of one request:

`schemas.parse_request` → `guards.answer_retry` / `answer_too_long` / `answer_cached` →
`loading.answer_model_unready` → `guards.answer_late` → `predict.answer_with_model` (admitted by the overload
control, `api.overload`; `batcher.submit(nbest, deadline)` ⇒ worker: `corrector.predict_batch`) →
`schemas.build_response`, then one log line and the request's metrics (`api.metrics`). The deadline counts from
the request's accept (`api.accept`), not from the view's start; the time between the two is what the overload
control watches.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import tomllib
from typing import Any

from flask import Flask, g, redirect, request
from spectree import Response, SpecTree
from werkzeug.wrappers import Response as WerkzeugResponse

from api import guards, schemas
from api.accept import budget_start
from api.errors import PayloadTooLarge
from api.interfaces import Engine
from api.loading import answer_model_unready, corrector_trouble
from api.logs import log_request
from api.metrics import metrics_view
from api.predict import answer_with_model
from api.state import app_state
from config import REPO_ROOT

logger = logging.getLogger("api")


def inference() -> dict[str, Any]:
    """Answer one question of the judge: the corrected sentence, or TOP1 when the model cannot in time."""
    view_start = time.monotonic()
    arrival = budget_start(request.environ, view_start)
    state = app_state()
    deadline = arrival + state.config.budget_s
    state.overload.observe(view_start - arrival)
    req = schemas.parse_request(read_body(state.config.max_body_bytes), state.config)
    g.esun_uuid = req.esun_uuid
    try:
        outcome = (
            guards.answer_retry(req, state.cache)
            or guards.answer_too_long(req, state.config.max_top1_chars)
            or guards.answer_cached(req, state.cache)
            or answer_model_unready(req, state.corrector)
            or guards.answer_late(req, deadline, state.config.min_model_budget_s, now=time.monotonic())
            or answer_with_model(req, state.batcher, state.cache, deadline=deadline, overload=state.overload)
        )
    except Exception as exc:  # a bug on the way: the question is readable, so TOP1 is still a valid answer
        logger.exception("answering %s failed; answering TOP1", req.esun_uuid)
        outcome = guards.top1(req, "error", reason=f"{type(exc).__name__}: {exc}")
    g.answer_path = outcome.path  # for the request's metrics (api.metrics.instrument)
    body = schemas.build_response(req.esun_uuid, outcome.answer, state.config, now=time.time())
    log_request(req.esun_uuid, req.retry, outcome.path, (time.monotonic() - arrival) * 1000,
                outcome.batch_size, outcome.reason, queued_ms=(view_start - arrival) * 1000)
    return body


def read_body(max_body_bytes: int) -> bytes:
    """Read the raw body whatever its Content-Type (the judge's template used get_json(force=True))."""
    body = request.get_data(cache=False)
    # werkzeug stops a streamed (chunked) body at MAX_CONTENT_LENGTH without saying it was cut.
    if request.content_length is None and len(body) >= max_body_bytes:
        raise PayloadTooLarge(f"body must be under {max_body_bytes} bytes")
    return body


def healthz() -> dict[str, str]:
    """Tell that the process is alive (it may not be ready)."""
    return {"status": "ok"}


def readyz() -> tuple[dict[str, Any], int]:
    """Tell whether the service can answer with the model: corrector loaded and set up, batcher running."""
    state = app_state()
    reasons = []
    if (trouble := corrector_trouble(state.corrector)) is not None:
        reasons.append(trouble)
    if not state.batcher.alive():
        reasons.append(batcher_trouble(state.batcher))
    return {"ready": not reasons, "reasons": reasons}, 503 if reasons else 200


def batcher_trouble(batcher: Engine) -> str:
    """Say why the batcher is not alive: a batch running too long, or no worker running."""
    snapshot = batcher.stats()
    if snapshot.worker_alive and snapshot.running_for_s > 0:
        return f"a batch has been running for {snapshot.running_for_s:.1f} s"
    return "batcher worker is not running"


def index() -> dict[str, Any]:
    """Describe the service: name, version, model and settings."""
    state = app_state()
    name, version = _project()
    model = state.batcher.describe() if state.corrector is None else state.corrector.info
    return {"name": name, "version": version, "model": _json_safe(model),
            "config": state.config.summary()}


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
    spec.register(app)  # /docs/openapi.json, /docs/swagger/, /docs/redoc/, ...
    app.add_url_rule("/openapi.json", "spec_json", lambda: spec.spec)
    app.add_url_rule("/docs", "docs_index", docs)
    # Prometheus text, not JSON: served outside the OpenAPI document.
    app.add_url_rule("/metrics", "metrics", metrics_view)
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
