"""The service's error types and the one place that turns errors into HTTP responses.

Every error answer is a JSON object `{"error": <code>, "detail": <text>}`: never an HTML page, never a
traceback. On the judge's path a model problem is not an error (it is a TOP1 answer, see `api.answers`);
what reaches here is a request the service cannot read, a wrong URL or method, or a bug.
"""

from __future__ import annotations

import json
import logging
from typing import ClassVar

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger("api.errors")

# The statuses gunicorn's event loop refuses a request with before the app (server.framing; counted by api.metrics),
# and the error code of each.
REFUSAL_CODES = {400: "bad_request", 413: "payload_too_large", 431: "header_fields_too_large", 501: "not_implemented"}
# Codes for HTTP errors raised by Flask/werkzeug themselves (routing, body size).
_HTTP_CODES = {400: REFUSAL_CODES[400], 404: "not_found", 405: "method_not_allowed", 413: REFUSAL_CODES[413]}


class ApiError(Exception):
    """An error the client caused; `status` and `code` say how it is answered."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, detail: str, esun_uuid: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.esun_uuid = esun_uuid


class InvalidRequest(ApiError):
    """The body is not a readable inference request (bad JSON, wrong type, out of range)."""

    status = 400
    code = "bad_request"


class PayloadTooLarge(ApiError):
    """The body is over `max_body_bytes`."""

    status = 413
    code = "payload_too_large"


def error_body(code: str, detail: str) -> bytes:
    """The bytes of every error body, the app's and the event loop's refusals alike (`server.framing`): Flask's own
    JSON format (keys sorted, compact, UTF-8, a final newline)."""
    return json.dumps({"error": code, "detail": detail}, ensure_ascii=False, separators=(",", ":"),
                      sort_keys=True).encode() + b"\n"


def error_response(status: int, code: str, detail: str) -> tuple[Response, int]:
    """Build the JSON error answer every handler returns."""
    return Response(error_body(code, detail), status, mimetype="application/json"), status


def register_error_handlers(app: Flask) -> None:
    """Map every error the app can meet to a JSON response."""
    app.register_error_handler(ApiError, _on_api_error)
    app.register_error_handler(HTTPException, _on_http_exception)
    app.register_error_handler(Exception, _on_unexpected)


def _on_api_error(exc: ApiError) -> tuple[Response, int]:
    log.info("rejected request",
             extra={"fields": _fields(status=exc.status, detail=exc.detail, esun_uuid=exc.esun_uuid)})
    return error_response(exc.status, exc.code, exc.detail)


def _on_http_exception(exc: HTTPException) -> tuple[Response, int] | HTTPException:
    status = exc.code or 500
    if status < 400:
        return exc  # redirects and the like pass through unchanged
    code = _HTTP_CODES.get(status, f"http_{status}")
    detail = exc.description or code
    if status == 413 and current_app.config.get("MAX_CONTENT_LENGTH"):  # werkzeug's own text names no limit
        detail = f"body must be under {current_app.config['MAX_CONTENT_LENGTH'] - 1} bytes"  # as api.routes says
    log.info("rejected request", extra={"fields": _fields(status=status, detail=detail)})
    response, status = error_response(status, code, detail)
    # Keep headers the status relies on (Allow for 405), drop werkzeug's HTML content type.
    for name, value in exc.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, status


def _on_unexpected(exc: Exception) -> tuple[Response, int]:
    log.error("unexpected error", exc_info=exc, extra={"fields": _fields(status=500, detail=repr(exc))})
    return error_response(500, "internal_error", "the server met an unexpected error")


def _fields(esun_uuid: str | None = None, **fields: object) -> dict[str, object]:
    """Describe the failing request for the log, with its esun_uuid when known (the view keeps it in g)."""
    return {"method": request.method, "url_path": request.path, "esun_uuid": esun_uuid or g.get("esun_uuid"),
            **fields}
