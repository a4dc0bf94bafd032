"""The objects one app serves with, built by `create_app` and kept in `app.extensions`."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app

from api.admission import Admission
from api.answers import AnswerPolicy
from api.interfaces import Corrector, Engine
from api.metrics import Metrics
from api.swap import ModelSwapper
from cache import LayeredResultCache
from config import Config

EXTENSION_KEY = "asr_correction"


@dataclass
class AppState:
    """What the doors of one app share (the views, and the worker's event loop through `api.state.serving_state`):
    its config, corrector, engine (a `batching` batcher), answer cache, admission, answer policy and metrics, and the
    swapper that watches where `weights_dir` leads (`api.swap`; None for an injected corrector or engine).

    corrector is None when the model runs in the engine's worker processes (`batching.process`), which set it up
    before the engine was built; the engine then describes it (`Engine.describe`).
    """

    config: Config
    corrector: Corrector | None
    engine: Engine
    cache: LayeredResultCache
    admission: Admission
    answers: AnswerPolicy
    metrics: Metrics
    swapper: ModelSwapper | None = None


def app_state() -> AppState:
    """Return the state of the app handling the current request."""
    return current_app.extensions[EXTENSION_KEY]


def serving_state(app: object) -> AppState | None:
    """Return the state of an app built by `create_app` (for the worker's event loop), else None."""
    extensions = app.extensions if isinstance(app, Flask) else {}
    state = extensions.get(EXTENSION_KEY)
    return state if isinstance(state, AppState) else None
