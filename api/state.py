"""The objects one app serves with, built by `create_app` and kept in `app.extensions`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flask import Flask, current_app

from api.admission import Admission
from api.answers import AnswerPolicy
from api.metrics import Metrics
from cache import LayeredResultCache
from config import Config
from hosting.host import ModelHost
from hosting.interfaces import Corrector, Engine

EXTENSION_KEY = "asr_correction"


@dataclass
class AppState:
    """What the doors of one app share (the views, and the worker's event loop through `api.state.serving_state`):
    its config, model host (`hosting`: the corrector, the engine, the watcher of `weights_dir`), answer cache,
    admission, answer policy and metrics.
    """

    config: Config
    host: ModelHost
    cache: LayeredResultCache
    admission: Admission
    answers: AnswerPolicy
    metrics: Metrics

    @property
    def corrector(self) -> Corrector | None:
        """The corrector; None when the model runs in the engine's worker processes (`batching.process`), which set
        it up before the engine was built; the engine then describes it (`Engine.describe`)."""
        return self.host.corrector

    @property
    def engine(self) -> Engine:
        return self.host.engine

    def starting(self) -> tuple[Callable[[], None], ...]:
        """What to start beside the requests once the app is built (`sidecar.lifecycle.start` calls them): the
        metrics' spool, when the workers share a folder. The model's loading is the host's (`create_app` starts it)."""
        return () if self.metrics.spool is None else (self.metrics.spool.start,)

    def closing(self) -> tuple[Callable[[], None], ...]:
        """What to close when the process stops, in order: the host (its watcher, then its engine: no question left
        on the model), then the cache (its queued shared writes landed), then the metrics' spool
        (`sidecar.lifecycle.stop` calls them; gunicorn's `worker_exit` and `python -m api` alike)."""
        return self.host.close, self.cache.close, self.metrics.close


def app_state() -> AppState:
    """Return the state of the app handling the current request."""
    return current_app.extensions[EXTENSION_KEY]


def serving_state(app: object) -> AppState | None:
    """Return the state of an app built by `create_app` (for the worker's event loop), else None."""
    extensions = app.extensions if isinstance(app, Flask) else {}
    state = extensions.get(EXTENSION_KEY)
    return state if isinstance(state, AppState) else None
