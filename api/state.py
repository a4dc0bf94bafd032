"""The objects one app serves with, built by `create_app` and kept in `app.extensions`."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from api.interfaces import Corrector, Engine
from api.overload import OverloadControl
from cache import ResultCache
from config import Config

EXTENSION_KEY = "asr_correction"


@dataclass
class AppState:
    """What the views of one app share: its config, corrector, batcher (the engine), answer cache and overload control.

    corrector is None when the model runs in the engine's worker processes (`batching.process`), which set it up
    before the engine was built; the engine then describes it (`Engine.describe`).
    """

    config: Config
    corrector: Corrector | None
    batcher: Engine
    cache: ResultCache
    overload: OverloadControl


def app_state() -> AppState:
    """Return the state of the app handling the current request."""
    return current_app.extensions[EXTENSION_KEY]
