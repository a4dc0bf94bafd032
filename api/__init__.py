"""HTTP and JSON only: the app factory, routes, request/response schemas, errors and guards."""

from api.app import create_app, preload

__all__ = ["create_app", "preload"]
