"""The objects one app serves with, built by `create_app` and kept in `app.extensions`."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from api.predict import BatcherLike, CorrectorLike
from cache import ResultCache
from config import Config

EXTENSION_KEY = "asr_correction"


@dataclass
class AppState:
    """What the views of one app share: its config, corrector, batcher and answer cache."""

    config: Config
    corrector: CorrectorLike
    batcher: BatcherLike
    cache: ResultCache


def app_state() -> AppState:
    """Return the state of the app handling the current request."""
    return current_app.extensions[EXTENSION_KEY]
