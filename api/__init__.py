"""HTTP and JSON only: the app factory, routes, request/response schemas, errors, and the one policy that decides
every /inference answer (api.answers, its paths named in api.paths)."""

from api.app import create_app, preload

__all__ = ["create_app", "preload"]
