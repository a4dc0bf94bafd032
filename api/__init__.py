"""HTTP and JSON: the app factory, routes, request/response schemas, errors, admission, the metrics' series, the request
log, and the one policy that decides every /inference answer (api.answers, its paths named in api.paths). The model
is asked through its host (`hosting`), which builds, loads, swaps and closes it: nothing here starts the model's
threads or processes, or freezes the garbage collector."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "preload"]


def __getattr__(name: str) -> Any:
    """`create_app` and `preload`, imported on first use: `python -m api` reads its flags, and says in one line what
    to run when this Python lacks the service's packages, before anything imports them (api/__main__.py)."""
    if name in __all__:
        from api import app

        return getattr(app, name)
    raise AttributeError(f"module 'api' has no attribute {name!r}")
