"""A server that breaks the judge's contract in the ways the clients must catch."""

from __future__ import annotations

import hashlib

from flask import Flask, request
from flask.typing import ResponseReturnValue


def create_bad_app() -> Flask:
    """Answer /inference with, in turn, a fifth key, a body that is not JSON, and a 500."""
    app = Flask(__name__)

    @app.post("/inference")
    def inference() -> ResponseReturnValue:
        body = request.get_json(force=True, silent=True) or {}
        uuid = str(body.get("esun_uuid", ""))
        kind = int(hashlib.sha256(uuid.encode()).hexdigest(), 16) % 3
        if kind == 0:
            return {"esun_uuid": uuid, "server_uuid": "x", "server_timestamp": 1.0, "answer": "好", "extra": 1}
        if kind == 1:
            return "not json", 200
        return {"error": "internal_error", "detail": "broken on purpose"}, 500

    return app
