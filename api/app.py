"""The application factory: the one place that builds the service's objects from a `Config`."""

from __future__ import annotations

import logging

from flask import Flask

from api.cache import build_cache
from api.errors import register_error_handlers
from api.logs import configure_logging
from api.predict import BatcherLike, CorrectorLike, batch_fn, size_of
from api.routes import register_routes
from api.state import EXTENSION_KEY, AppState
from config import Config
from model.batcher import Batcher

log = logging.getLogger("api.app")


def create_app(
    config: Config | None = None,
    corrector: CorrectorLike | None = None,
    batcher: BatcherLike | None = None,
) -> Flask:
    """Build the Flask app with its corrector, batcher and answer cache.

    By default the config comes from the environment and the corrector is the real one from
    `model.corrector`, loaded and warmed up here (`setup()`); an injected corrector (tests inject fakes)
    must be set up already. An injected batcher replaces the one built around the corrector.
    """
    config = config or Config.from_env()
    configure_logging(config.log_level)
    cache = build_cache(config)
    if corrector is None:
        corrector = _load_corrector(config)
    if batcher is None:
        batcher = _build_batcher(config, corrector)

    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.ensure_ascii = False  # answers in UTF-8: shorter, and readable in logs
    app.extensions[EXTENSION_KEY] = AppState(
        config=config, corrector=corrector, batcher=batcher, cache=cache
    )
    register_error_handlers(app)
    register_routes(app)
    log.info("app ready", extra={"fields": {"config": config.summary()}})
    return app


def _load_corrector(config: Config) -> CorrectorLike:
    # Imported here so that tests with fake correctors never import torch.
    from model.corrector import Corrector

    corrector = Corrector(weights_dir=config.weights_dir, device=config.device)
    corrector.setup()
    return corrector


def _build_batcher(config: Config, corrector: CorrectorLike) -> BatcherLike:
    return Batcher(
        batch_fn(corrector),
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_batch_wait_s,
        max_in_flight=config.max_in_flight,
        policy=config.batch_policy,
        size_of=size_of,
        name="corrector",
    )
