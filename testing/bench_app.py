"""The app the benchmark serves: the service's own app plus one read-only route with the batcher's counters.

`gunicorn -c server/gunicorn_conf.py "testing.bench_app:create_bench_app()"` serves exactly what `make run` serves
(`api:create_app()`: the shipped corrector, batcher and settings from the environment) and adds
`GET /_bench/batcher`, the batcher's `stats()` (batches, items, padded waste, expired, overloaded), which no
route of the service exposes. `create_bench_app(fake=True)` serves tests/fakes.py's FakeCorrector,
to smoke-test the benchmark on a checkout without weights (`python -m testing.bench --fake`).
"""

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
