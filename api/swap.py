"""Another weights folder swapped in under traffic, without a restart (issue 47).

`WEIGHTS_DIR` may name a symlink (`adapted/current -> adapted/run-7`). Each gunicorn worker's `ModelSwapper` looks
where it leads every `WEIGHTS_POLL_S` on a thread of its own; once it leads to another folder than the one served
(`ln -sfn adapted/run-8 adapted/current` repoints it atomically):

1. the folder is checked as at start (`model.contract.check_weights_dir`: its files, every field of its config.json,
   an adapted folder's parts and their sha256);
2. a new corrector is built from it and set up (weights read, warm-up batches) beside the served one, which answers
   every question meanwhile (no `model_loading` answer);
3. `LoadingCorrector.replace` puts it in place between two batches: the batch running ends on the old corrector,
   the next runs on the new one (a batch runs wholly on one model), and the old one is released and freed.

A folder that fails at 1 or 2 changes nothing: the old corrector goes on answering, `/readyz` stays 200, one log
line says why (`model swap failed`), `esun_model_swaps_total{result="failed"}` counts it, and the folder is not
tried again until the link leads elsewhere. The answer cache is not touched: a retry gets its first attempt's
answer, whichever model gave it; new questions get the new model. `GET /` (`serving`) and `/metrics`
(`esun_model_served_since_seconds`, labelled with the folder and its network's sha256; with several workers each
worker's series) say which folder each worker serves and since when.

The process engine (`BATCHER_WORKERS` > 1) swaps its worker processes one at a time
(`batching.process_swap`): after the check, each is replaced by a process that built the new folder's corrector,
once that one is ready, the others answering meanwhile; a folder whose corrector fails to build there changes
nothing either. Each worker process loads a folder, never the link (a set started later to replace a dead one
loads the folder served).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from api.interfaces import Corrector
from api.loading import LoadingCorrector, prompt_thread_switches
from api.metrics import NAMESPACE
from model.contract import FeatureContractError, check_weights_dir, sha256
from model.weights_meta import NETWORK_FILE, WeightsMeta

log = logging.getLogger("api.swap")

DONE, FAILED, REFUSED = "done", "failed", "refused"
RESULTS = (DONE, FAILED, REFUSED)
# How long a swap waits for the batch running on the old corrector (a batch takes ~0.1 s; a stuck one keeps its
# corrector, which is then not released: it is freed when that batch returns).
BATCH_WAIT_S = 10.0
LINK_GAP_S = 0.2


class SwapFailed(RuntimeError):
    """A weights folder could not be swapped in (refused by the weights contract, or its corrector failed to load or
    warm up); the corrector served before goes on answering."""


@runtime_checkable
class Releasable(Protocol):
    """A corrector that can drop what its setup built at once (`model.corrector.Corrector.release`)."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class Served:
    """The weights folder a worker serves: where, what (its network's sha256, its adaptation run), since when."""

    folder: Path
    name: str
    sha256: str
    adaptation: dict[str, Any] | None
    since: float  # time.time()

    @classmethod
    def of(cls, folder: Path, meta: WeightsMeta, since: float) -> Served:
        provenance = meta.adaptation.provenance if meta.adaptation is not None else None
        return cls(folder, meta.name, sha256(folder / NETWORK_FILE), provenance, since)

    @property
    def adapted_from(self) -> str:
        """A short tag of the adaptation run: the sha256 prefixes of the files it learned from ("" if none)."""
        data = (self.adaptation or {}).get("data") or []
        return ",".join(str(d.get("sha256", ""))[:12] for d in data if isinstance(d, dict))

    def describe(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "name": self.name, "sha256": self.sha256, "adaptation": self.adaptation,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))}


def resolve(watched: Path) -> Path:
    """The folder `watched` leads to now (every symlink on the way followed)."""
    return Path(os.path.realpath(watched))


class ModelSwapper:
    """Watch where `watched` leads, and swap the folder it leads to into `loader` (see the module docstring).

    `loader` None: the process engine, whose worker processes `install(folder)` replaces one at a time (raising on
    any failure); without `install` a new target is refused in one log line. `build` makes a set-up corrector from
    a folder (it raises on any failure). `folder` is the folder the served corrector
    is built from (where `watched` led then). `forget(folder)` drops what was read for other folders than the one
    now served (`model.corrector.forget_shared`)."""

    def __init__(self, watched: Path, folder: Path, loader: LoadingCorrector | None,
                 build: Callable[[Path], Corrector] | None, poll_s: float,
                 forget: Callable[[Path], object] | None = None, batch_wait_s: float = BATCH_WAIT_S,
                 install: Callable[[Path], object] | None = None) -> None:
        self.watched = Path(watched)
        self.folder = Path(folder)
        self._loader = loader
        self._build = build
        self._forget = forget
        self._install = install
        self._poll_s = poll_s
        self._batch_wait_s = batch_wait_s
        self._served: Served | None = None
        self._tried: Path | None = None  # the last target that failed or was refused: not tried again
        self._counts = dict.fromkeys(RESULTS, 0)
        self._swapping = threading.Lock()  # one look at a time (the watcher's thread, a test's call)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def served(self) -> Served | None:
        """The folder served, once its corrector is set up (None before, or when its first load failed)."""
        return self._served

    def counts(self) -> dict[str, int]:
        """Swaps by result: done, failed, refused."""
        return dict(self._counts)

    def start(self) -> ModelSwapper:
        """Start the watcher thread: it records the folder first served, then looks every `poll_s` (0: never)."""
        self._thread = threading.Thread(target=self._run, name="model-swap", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop looking (a swap under way ends first; a daemon thread either way)."""
        self._stop.set()

    def record_start(self) -> None:
        """Record the folder served at start, once its corrector is set up (the process engine's: at once)."""
        if self._loader is not None and not self._loader.ready:
            return
        try:
            self._served = Served.of(self.folder, WeightsMeta.load(self.folder), time.time())
        except (OSError, ValueError) as exc:  # removed since it loaded: GET / and /metrics say nothing of it
            log.warning("could not describe the folder served", extra={"fields": {"folder": str(self.folder),
                                                                                   "error": str(exc)}})

    def check(self) -> str | None:
        """Look where `watched` leads once and act on it: the result (done, failed, refused), or None when it
        leads to the folder served, or to one that failed or was refused before."""
        with self._swapping:
            target = resolve(self.watched)
            if not target.exists():  # `ln -sfn` removes the link, then makes the new one: look again a moment later
                time.sleep(LINK_GAP_S)
                target = resolve(self.watched)
            if target == self.folder:
                self._tried = None
                return None
            if target == self._tried:
                return None
            self._tried = target
            if self._install is None and (self._loader is None or self._build is None):
                self._counts[REFUSED] += 1
                log.warning("weights_dir now leads to another folder, which this engine does not swap in: restart to "
                            "serve it", extra={"fields": {
                                "event": "model_swap_refused", "folder": str(target), "serving": str(self.folder)}})
                return REFUSED
            try:
                self._swap(target)
            except SwapFailed as exc:
                self._counts[FAILED] += 1
                log.error("model swap failed; still serving %s", self.folder, extra={"fields": {
                    "event": "model_swap_failed", "folder": str(target), "error": str(exc)}})
                return FAILED
            self._tried = None
            self._counts[DONE] += 1
            return DONE

    def _swap(self, target: Path) -> None:
        """Check, build and warm up `target` beside the served model, then put it in place (raises SwapFailed)."""
        started = time.monotonic()
        corrector = None
        try:
            meta = check_weights_dir(target)
            if self._loader is not None and self._build is not None:
                with prompt_thread_switches():
                    corrector = self._build(target)
            elif self._install is not None:
                self._install(target)  # the process engine: its processes replaced one at a time, or none
            served = Served.of(target, meta, time.time())
        except FeatureContractError as exc:
            raise SwapFailed(str(exc)) from None
        except Exception as exc:  # whatever setup() raises on a folder that is not a model: one line, no traceback
            raise SwapFailed(f"{type(exc).__name__}: {exc}") from None
        previous, self.folder, self._served = self.folder, target, served
        released = corrector is not None and self._put_in_place(corrector, target)
        log.info("model swapped in", extra={"fields": {
            "event": "model_swapped", "folder": str(target), "previous": str(previous), "sha256": served.sha256,
            "load_s": round(time.monotonic() - started, 3), "old_released": released}})

    def _put_in_place(self, corrector: Corrector, target: Path) -> bool:
        """Replace the served corrector between two batches and free the old one; say whether it was released."""
        assert self._loader is not None
        old, idle = self._loader.replace(corrector, self._batch_wait_s)
        if idle and isinstance(old, Releasable):
            old.release()
        del old
        if self._forget is not None:
            self._forget(target)
        # The new model's objects join the frozen ones, as at start (api.loading.freeze_set_up), without a full
        # collection now: only the young generations, which stop the process for milliseconds, not hundreds.
        gc.collect(1)
        gc.freeze()
        return idle

    def describe(self) -> dict[str, Any]:
        """What `GET /` shows: the link watched, the folder served and since when, the swaps by result."""
        served = self._served
        return {"weights_dir": str(self.watched), "swaps": self.counts(), "poll_s": self._poll_s,
                "swaps_in": ("this worker" if self._loader is not None else "its worker processes, one at a time"
                             if self._install is not None else "no: restart"),
                **(served.describe() if served is not None else {"folder": str(self.folder)})}

    def _run(self) -> None:
        if self._loader is not None:
            while not self._loader.wait(timeout=1.0):
                if self._stop.is_set():
                    return
        self.record_start()
        if self._poll_s <= 0:
            return
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # a bug here must not end the watching; the served corrector is untouched
                log.exception("looking for a new weights folder failed")


class SwapCollector(Collector):
    """The swapper's series: swaps by result, and the folder served with the time since when."""

    def __init__(self, swapper: ModelSwapper) -> None:
        self._swapper = swapper

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        swaps = CounterMetricFamily(f"{NAMESPACE}_model_swaps", "Weights folders swapped in (done), that failed and "
                                    "changed nothing (failed), or that the process engine does not swap (refused).",
                                    labels=["result"])
        for result, count in self._swapper.counts().items():
            swaps.add_metric([result], count)
        served = GaugeMetricFamily(f"{NAMESPACE}_model_served_since_seconds", "Unix time since which this worker "
                                   "serves the weights folder of its labels (its config's name, its network's "
                                   "sha256; adapted: the sha256 prefixes of the files its adaptation learned from).",
                                   labels=["folder", "name", "sha256", "adapted"])
        now = self._swapper.served
        if now is not None:
            served.add_metric([str(now.folder), now.name, now.sha256, now.adapted_from], now.since)
        yield from (swaps, served)
