"""The application factory: the one place that builds the service's objects from a `Config`, in the order a request
meets them: config, model host (`hosting`), answer cache, admission, answer policy, routes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

from flask import Flask

from api.admission import Admission
from api.answers import AnswerPolicy
from api.errors import register_error_handlers
from api.logs import configure_logging
from api.metrics import METRICS_KEY, Metrics, instrument
from api.routes import register_routes
from api.state import EXTENSION_KEY, AppState
from cache import LayeredResultCache, build_cache
from config import Config
from hosting.build import build_host
from hosting.interfaces import Corrector, Engine

log = logging.getLogger("api.app")


def create_app(
    config: Config | None = None,
    corrector: Corrector | None = None,
    engine: Engine | None = None,
    make_admission: Callable[[Callable[[], int]], Admission] | None = None,
    cache: LayeredResultCache | None = None,
    build_corrector: Callable[[Path], Corrector] | None = None,
) -> Flask:
    """Build the Flask app: its model host, answer cache, admission, answer policy, metrics and routes.

    By default the config comes from the environment and the host (`hosting.build.build_host`) checks the weights
    folder (ConfigError in one line), then loads the real corrector on a thread once started (TOP1 answers and
    `/readyz` 503 meanwhile), or in `batcher_workers` worker processes before this returns, and watches where
    `weights_dir` leads. Tests inject fakes: a `corrector` (set up, or a started `LoadingCorrector`) and an `engine`,
    served without a watcher, or `build_corrector(folder)` in place of the real corrector's builder; `make_admission`
    builds the admission from the engine's count of questions on the model (default `Admission.from_config`; tests
    build one on a fake clock); an injected `cache` replaces the config's (tests inject one on a fake Redis).
    """
    config = config or Config.from_env()
    configure_logging(config.log_level)
    metrics = Metrics(spool_dir=Path(config.shared_dir) / "metrics" if config.shared_dir else None)
    host = build_host(config, metrics.observe_batch, corrector, engine, build_corrector)
    cache = cache or build_cache(config, observer=metrics)
    admission = (make_admission or partial(Admission.from_config, config))(host.engine.in_flight)
    answers = AnswerPolicy(config, cache, host.corrector, host.engine, admission, metrics)
    metrics.watch_admission(admission)
    metrics.watch_host(host)
    metrics.watch_cache(cache.local)

    app = _flask_app(config)
    app.extensions[EXTENSION_KEY] = AppState(config=config, host=host, cache=cache, admission=admission,
                                             answers=answers, metrics=metrics)
    app.extensions[METRICS_KEY] = metrics
    register_error_handlers(app)
    register_routes(app)
    instrument(app)
    if not config.captain_email:
        # server_uuid is sha256(captain_email + str(int(utc_now)) + salt): without the email it names no team.
        log.warning("CAPTAIN_EMAIL is not set: server_uuid will not identify the team")
    log.info("app ready", extra={"fields": {"config": config.summary()}})
    host.start()  # last: the model's loading competes for the GIL with whatever this thread still does
    return app


def _flask_app(config: Config) -> Flask:
    app = Flask(__name__)
    # One byte over the limit: werkzeug cuts a streamed (chunked) body there without saying so, and the view refuses
    # a body of more than max_body_bytes (api.routes.read_body) whichever way it came.
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes + 1
    app.json.ensure_ascii = False  # answers in UTF-8: shorter, and readable in logs
    return app


def preload(with_model: bool = True, config: Config | None = None) -> None:
    """Prepare a process that will fork workers: import the corrector's modules (torch) and read what every
    worker's setup reads alike (`model.corrector.preload`) when `with_model`, and build the routes once on a
    throwaway app, so that pydantic and spectree have generated the schemas. Starts no thread and touches no
    device (neither would survive a fork)."""
    if with_model:
        from model.corrector import preload as preload_model

        preload_model(config.weights_dir if config else None, with_lm=config is None or config.stage != "net")
    register_routes(Flask("preload"))
