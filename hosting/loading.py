"""The corrector, built and set up on a thread, so that the server answers from the moment its port is open.

Loading the model (importing torch, reading the weights, the warm-up batch) takes seconds. Done before serving,
it left `/healthz` unanswered that long (an orchestrator probing liveness would kill a booting replica) and, when
gunicorn replaced a dead worker, every question waiting past its deadline. `LoadingCorrector` stands in for the
corrector from the start instead: while `build()` runs it is not ready, so questions are answered TOP1 at once
(path `model_loading`, `api.answers`) and `/readyz` says 503 with the reason; once `build()`
has returned a set-up corrector, it answers through it. A failed build is logged and leaves it unready for good
(TOP1 answers, `/readyz` 503 naming the error) until the process is restarted or another folder is swapped in.

`replace()` puts another set-up corrector in its place (`hosting.host.InProcessHost.swap`, which builds it beside
the old one): it waits for the batch running on the old corrector to end, so that every batch runs wholly on one
corrector, and returns the old one, then used by no batch.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hosting.interfaces import Corrector
from preprocess.text import NBest

log = logging.getLogger("hosting.loading")
LOADING_SWITCH_INTERVAL_S = 0.0005


class ModelNotLoaded(RuntimeError):
    """The corrector was asked to predict before it was loaded (until then api.answers answers TOP1 without it)."""


class LoadingCorrector:
    """A corrector that `build()` makes on a thread of its own; a `Corrector` from the start.

    Thread safety: the built corrector is published by one reference assignment, after its setup() returned,
    and read once per call, so a reader sees either nothing or a corrector that is set up. A batch holds `_using`
    while it runs (one batch thread: never contended but by `replace`), so a replacement waits for it.
    """

    def __init__(self, build: Callable[[], Corrector], name: str = "corrector") -> None:
        self._build = build
        self._name = name
        self._corrector: Corrector | None = None
        self._error: str | None = None
        self._started = time.monotonic()
        self._done = threading.Event()
        self._using = threading.Lock()

    def start(self) -> LoadingCorrector:
        """Start building the corrector on a daemon thread; return self."""
        self._started = time.monotonic()
        threading.Thread(target=self._load, name=f"{self._name}-loader", daemon=True).start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the build has ended (set up or failed); False when `timeout` seconds passed first."""
        return self._done.wait(timeout)

    @property
    def loading(self) -> bool:
        return not self._done.is_set()

    @property
    def ready(self) -> bool:
        corrector = self._corrector
        return corrector is not None and corrector.ready

    def trouble(self) -> str | None:
        """Say why the corrector cannot answer (loading since when, or why it failed), or None when it can."""
        if self._error is not None:
            return f"model failed to load: {self._error}"
        corrector = self._corrector
        if corrector is None:
            return f"model is loading (for {time.monotonic() - self._started:.1f} s)"
        return None if corrector.ready else "corrector is not set up"

    def setup(self) -> None:
        """Build the corrector on this thread (`start()` builds it on a thread of its own)."""
        self._load()

    def predict_batch(self, items: list[NBest]) -> list[Any]:
        with self._using:  # the whole batch on one corrector: replace() waits for it
            corrector = self._corrector
            if corrector is None:
                raise ModelNotLoaded(self.trouble())
            return corrector.predict_batch(items)

    def replace(self, corrector: Corrector, wait_s: float) -> tuple[Corrector | None, bool]:
        """Answer with `corrector` (set up already) from the next batch on; return the corrector it replaces and
        whether that one is now idle: False when the batch running on it did not end within `wait_s` (a stuck
        batch keeps its corrector until it returns; the batch after it runs on the new one all the same)."""
        idle = self._using.acquire(timeout=wait_s)
        try:
            old, self._corrector = self._corrector, corrector
            self._error = None
        finally:
            if idle:
                self._using.release()
        return old, idle

    @property
    def info(self) -> dict[str, Any]:
        corrector = self._corrector
        if corrector is not None:
            return corrector.info
        return {"name": self._name, "state": "failed" if self._error else "loading", "error": self._error}

    def _load(self) -> None:
        try:
            with prompt_thread_switches():
                corrector = self._build()
        except Exception as exc:  # reported by /readyz and the log; the service goes on answering TOP1
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception("loading the %s failed; answering TOP1", self._name)
        else:
            freeze_set_up()
            self._corrector = corrector
            info = corrector.info
            log.info("%s loaded", self._name, extra={"fields": {
                "load_s": round(time.monotonic() - self._started, 3), "device": info.get("device"),
                "precision": info.get("precision"), "runtime": info.get("runtime")}})
        finally:
            self._done.set()


_loaders_lock = threading.Lock()
_loaders_running = 0
_default_switch_interval_s = sys.getswitchinterval()


@contextmanager
def prompt_thread_switches() -> Iterator[None]:
    """Shorten the GIL's switch interval while any corrector loads.

    A loading thread is Python-bound for long stretches; a request thread that gave the GIL up for I/O waits up to
    the switch interval to get it back, at each of its many I/O calls: at the default 5 ms a /healthz took 150 ms.
    """
    global _loaders_running
    with _loaders_lock:
        _loaders_running += 1
        sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        with _loaders_lock:
            _loaders_running -= 1
            if _loaders_running == 0:
                sys.setswitchinterval(_default_switch_interval_s)


def freeze_set_up() -> None:
    """Move every object alive now (the set-up model, its vocabulary, lexicon and confusion sets: ~600,000 tracked
    objects) to the cyclic GC's permanent generation, which no collection scans again (`gc.freeze`).

    A served process's full collections ran every 5-7 s on new lists and each scanned everything tracked: 300 ms after
    set-up, growing to 940 ms (one of 1.7 s) as the caches filled, every request of the process stopped meanwhile
    (docs/benchmarks.md). Frozen objects are still freed by their reference counts; only a cycle among them would
    outlive its last reference, and a set-up model holds none that it drops. The caches' own values are kept as
    tuples of numbers and strings, which the GC stops tracking (`model.lm`, `model.features`)."""
    gc.collect()  # the set-up's garbage first, so that none of it is frozen
    gc.freeze()


def corrector_trouble(corrector: Corrector | None) -> str | None:
    """Say why the corrector cannot answer yet (loading, failed, not set up), or None when it can.

    None stands for a corrector in the engine's worker processes: set up before the engine was built.
    """
    if corrector is None:
        return None
    if isinstance(corrector, LoadingCorrector):
        return corrector.trouble()
    return None if corrector.ready else "corrector is not set up"


def corrector_loading(corrector: Corrector | None) -> bool:
    """Tell whether the corrector is still being built (not failed, not done)."""
    return isinstance(corrector, LoadingCorrector) and corrector.loading
