"""The app the benchmark serves: `api:create_app()` (or the fake corrector's) plus `GET /_bench/batcher`."""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import Flask

from api.state import EXTENSION_KEY

STATS_ROUTE = "/_bench/batcher"


def create_bench_app(fake: bool = False) -> Flask:
    """Build the service's app (or the fake-corrector one) and add the batcher's counters at STATS_ROUTE."""
    if fake:
        from tests.fakes import create_fake_app

        app = create_fake_app()
    else:
        from api import create_app

        app = create_app()

    def batcher_stats() -> dict[str, Any]:
        return dataclasses.asdict(app.extensions[EXTENSION_KEY].batcher.stats())  # every engine's BatcherStats

    app.add_url_rule(STATS_ROUTE, "bench_batcher_stats", batcher_stats)
    return app
