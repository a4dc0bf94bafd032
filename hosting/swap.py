"""Another weights folder swapped in under traffic, without a restart (issue 47): the watcher of the link.

`WEIGHTS_DIR` may name a symlink (`adapted/current -> adapted/run-7`). Each gunicorn worker's `ModelSwapper` looks
where it leads every `WEIGHTS_POLL_S` on a thread of its own; once it leads to another folder than the one served
(`ln -sfn adapted/run-8 adapted/current` repoints it atomically), it asks its host to serve that folder
(`ModelHost.swap`, `hosting.host`), which checks it as at start, builds its corrector beside the served one and puts
it in place: in this process between two batches (`InProcessHost`), or in the engine's worker processes one at a
time (`ProcessHost`).

A folder the host refuses, or whose corrector fails to build, changes nothing: the old corrector goes on answering,
`/readyz` stays 200, one log line says why (`model swap failed`), `esun_model_swaps_total{result="failed"}` counts
it, and the folder is not tried again until the link leads elsewhere. The answer cache is not touched: a retry gets
its first attempt's answer, whichever model gave it; new questions get the new model. `GET /` (`serving`) and
`/metrics` (`esun_model_served_since_seconds`, labelled with the folder and its network's sha256; with several
workers each worker's series) say which folder each worker serves and since when.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from hosting.served import Served, SwapFailed, resolve
from model.weights_meta import WeightsMeta

log = logging.getLogger("hosting.swap")

DONE, FAILED = "done", "failed"
RESULTS = (DONE, FAILED)
LINK_GAP_S = 0.2


class Swappable(Protocol):
    """What the watcher asks of its host (`hosting.host.ModelHost`)."""

    def swap(self, folder: Path) -> Served: ...

    def wait_loaded(self, timeout: float) -> bool: ...

    def trouble(self) -> str | None: ...


class ModelSwapper:
    """Watch where `watched` leads, and ask `host` to serve the folder it leads to (see the module docstring).

    `folder` is the folder the served corrector is built from (where `watched` led then)."""

    def __init__(self, watched: Path, folder: Path, host: Swappable, poll_s: float) -> None:
        self.watched = Path(watched)
        self.folder = Path(folder)
        self._host = host
        self._poll_s = poll_s
        self._served: Served | None = None
        self._tried: Path | None = None  # the last target that failed: not tried again
        self._counts = dict.fromkeys(RESULTS, 0)
        self._swapping = threading.Lock()  # one look at a time (the watcher's thread, a test's call)
        self._stop = threading.Event()

    @property
    def served(self) -> Served | None:
        """The folder served, once its corrector is set up (None before, or when its first load failed)."""
        return self._served

    def counts(self) -> dict[str, int]:
        """Swaps by result: done, failed."""
        return dict(self._counts)

    def start(self) -> ModelSwapper:
        """Start the watcher thread: it records the folder first served, then looks every `poll_s` (0: never)."""
        threading.Thread(target=self._run, name="model-swap", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop looking (a swap under way ends first; a daemon thread either way)."""
        self._stop.set()

    def record_start(self) -> None:
        """Record the folder served at start, once its corrector is set up."""
        if self._host.trouble() is not None:
            return
        try:
            self._served = Served.of(self.folder, WeightsMeta.load(self.folder), time.time())
        except (OSError, ValueError) as exc:  # removed since it loaded: GET / and /metrics say nothing of it
            log.warning("could not describe the folder served", extra={"fields": {"folder": str(self.folder),
                                                                                   "error": str(exc)}})

    def check(self) -> str | None:
        """Look where `watched` leads once and act on it: the result (done, failed), or None when it leads to the
        folder served, or to one that failed before."""
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
            started = time.monotonic()
            try:
                served = self._swap(target)
            except SwapFailed as exc:
                self._counts[FAILED] += 1
                log.error("model swap failed; still serving %s", self.folder, extra={"fields": {
                    "event": "model_swap_failed", "folder": str(target), "error": str(exc)}})
                return FAILED
            previous, self.folder, self._served, self._tried = self.folder, target, served, None
            self._counts[DONE] += 1
            log.info("model swapped in", extra={"fields": {
                "event": "model_swapped", "folder": str(target), "previous": str(previous), "sha256": served.sha256,
                "load_s": round(time.monotonic() - started, 3)}})
            return DONE

    def _swap(self, target: Path) -> Served:
        if not target.exists():
            raise SwapFailed(f"{self.watched} leads to {target}, which does not exist")
        return self._host.swap(target)

    def describe(self) -> dict[str, Any]:
        """What `GET /` shows: the link watched, the folder served and since when, the swaps by result."""
        served = self._served
        return {"weights_dir": str(self.watched), "swaps": self.counts(), "poll_s": self._poll_s,
                **(served.describe() if served is not None else {"folder": str(self.folder)})}

    def _run(self) -> None:
        while not self._host.wait_loaded(timeout=1.0):
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
