"""The model's life behind one contract, whatever the engine: `ModelHost` (build, check, load, warm, swap, release).

Two hosts:

- `InProcessHost`: the corrector in this process, built and set up on a thread (`hosting.loading.LoadingCorrector`)
  and served by the threaded batcher (`batching.Batcher`). A swap builds the new folder's corrector beside the
  served one (the GIL's switch interval shortened meanwhile), puts it in place between two batches
  (`LoadingCorrector.replace`: the batch running ends on the old corrector, the next runs on the new one), then
  releases the old one and freezes the new one's objects, as at start (`hosting.loading.freeze_set_up`).
- `ProcessHost`: the corrector in the process engine's worker processes (`batching.process.ProcessBatcher`), set up
  before the engine was built. A swap replaces its processes one at a time, the others answering meanwhile
  (`batching.process_set.WorkerSet.swap`); each loads a folder, never the link (a set started later to replace a
  dead one loads the folder served).

Either way a swap first checks the folder as at start (`hosting.served.check_folder`), changes nothing when it fails
(SwapFailed in one line), and is asked for by the link's watcher (`hosting.swap.ModelSwapper`), which the host starts
and stops. `close()` stops the watcher, then the engine; the app closes its cache and metrics after it
(`api.state.AppState.closing`), under gunicorn (`worker_exit`) and `python -m api` alike.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hosting.interfaces import Corrector, Engine
from hosting.loading import LoadingCorrector, corrector_loading, corrector_trouble, prompt_thread_switches
from hosting.served import Served, check_folder, swap_errors
from hosting.swap import ModelSwapper

log = logging.getLogger("hosting.host")

# How long a swap waits for the batch running on the old corrector (a batch takes ~0.1 s; a stuck one keeps its
# corrector, which is then not released: it is freed when that batch returns).
BATCH_WAIT_S = 10.0


class ModelHost(Protocol):
    """What the app asks of the model's life: the engine to submit to, the corrector (None when it runs in the
    engine's processes), whether it can answer yet, a swap, a description, and the close."""

    @property
    def engine(self) -> Engine: ...

    @property
    def corrector(self) -> Corrector | None: ...

    @property
    def swapper(self) -> ModelSwapper | None:
        """The watcher of `weights_dir` (None for a model a test injected: nothing to watch)."""
        ...

    def start(self) -> None:
        """Start loading the model (if it loads here) and watching the link."""
        ...

    def swap(self, folder: Path) -> Served:
        """Serve `folder` from now on; raise SwapFailed (in one line), the served model kept, when it cannot."""
        ...

    def wait_loaded(self, timeout: float) -> bool:
        """Wait until the first model has loaded or failed; False when `timeout` seconds passed first."""
        ...

    def loading(self) -> bool:
        """Say whether the first model is still loading (not failed, not done)."""
        ...

    def trouble(self) -> str | None:
        """Say why the model cannot answer (loading, failed, not set up), or None when it can."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What `GET /` shows as `serving`: the link watched, the folder served and since when, the swaps; None when
        nothing is watched."""
        ...

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching, then close the engine (items in flight finish until `timeout`)."""
        ...


@runtime_checkable
class Releasable(Protocol):
    """A corrector that can drop what its setup built at once (`model.corrector.Corrector.release`)."""

    def release(self) -> None: ...


class _Watching:
    """The lifecycle both hosts share: the watcher, started after the model and stopped before the engine."""

    _engine: Engine
    _swaps_in = ""  # what GET / says swaps: this worker, or its worker processes
    swapper: ModelSwapper | None = None

    @property
    def engine(self) -> Engine:
        return self._engine

    def watch(self, watched: Path, folder: Path, poll_s: float) -> None:
        """Watch where `watched` leads (it led to `folder`, served now) every `poll_s` once started."""
        self.swapper = ModelSwapper(watched, folder, self, poll_s)

    def describe(self) -> dict[str, Any] | None:
        if self.swapper is None:
            return None
        return {**self.swapper.describe(), "swaps_in": self._swaps_in}

    def close(self, timeout: float = 5.0) -> None:
        if self.swapper is not None:
            self.swapper.close()
        self._engine.close(timeout)


class InProcessHost(_Watching):
    """The corrector in this process, behind the threaded batcher (see the module docstring).

    `build(folder)` makes a set-up corrector from a folder (it raises on any failure); None: `corrector` was
    injected, and a swap is refused. `forget(folder)` drops what was read for other folders than `folder`
    (`model.corrector.forget_shared`)."""

    _swaps_in = "this worker"

    def __init__(self, corrector: Corrector, engine: Engine, build: Callable[[Path], Corrector] | None = None,
                 forget: Callable[[Path], object] | None = None, batch_wait_s: float = BATCH_WAIT_S) -> None:
        self._corrector = corrector
        self._engine = engine
        self._build = build
        self._forget = forget
        self.batch_wait_s = batch_wait_s
        self._to_start = corrector if isinstance(corrector, LoadingCorrector) and build is not None else None

    @property
    def corrector(self) -> Corrector:
        return self._corrector

    def start(self) -> None:
        if self._to_start is not None:
            self._to_start.start()  # the loading competes for the GIL with whatever the app's thread still does
        if self.swapper is not None:
            self.swapper.start()  # waits for the loader, then looks where WEIGHTS_DIR leads every WEIGHTS_POLL_S

    def wait_loaded(self, timeout: float) -> bool:
        corrector = self._corrector
        return corrector.wait(timeout) if isinstance(corrector, LoadingCorrector) else True

    def loading(self) -> bool:
        return corrector_loading(self._corrector)

    def trouble(self) -> str | None:
        return corrector_trouble(self._corrector)

    def swap(self, folder: Path) -> Served:
        loader = self._corrector
        if self._build is None or not isinstance(loader, LoadingCorrector):
            raise TypeError("this host serves an injected corrector: it builds none to swap in")
        meta = check_folder(folder)
        with swap_errors(), prompt_thread_switches():
            corrector = self._build(folder)
            served = Served.of(folder, meta, time.time())
        old, idle = loader.replace(corrector, self.batch_wait_s)
        if idle and isinstance(old, Releasable):
            old.release()
        elif not idle:
            log.warning("the batch on the old corrector did not end in time: it is freed when that batch returns",
                        extra={"fields": {"folder": str(folder), "batch_wait_s": self.batch_wait_s}})
        del old
        if self._forget is not None:
            self._forget(folder)
        # The new model's objects join the frozen ones, as at start (hosting.loading.freeze_set_up), without a full
        # collection now: only the young generations, which stop the process for milliseconds, not hundreds.
        gc.collect(1)
        gc.freeze()
        return served


class ProcessHost(_Watching):
    """The corrector in the process engine's worker processes (see the module docstring); `init_kwargs(folder)`:
    what each process builds its corrector from (`batching.process.ImportedModel.init_model`)."""

    _swaps_in = "its worker processes, one at a time"

    def __init__(self, engine: Any, init_kwargs: Callable[[Path], dict[str, Any]]) -> None:
        self._engine = engine  # a batching.process.ProcessBatcher (imported only where it is built)
        self._init_kwargs = init_kwargs

    @property
    def corrector(self) -> None:
        return None  # set up in the worker processes before the engine was built; the engine describes it

    def start(self) -> None:
        if self.swapper is not None:
            self.swapper.start()

    def wait_loaded(self, timeout: float) -> bool:
        return True

    def loading(self) -> bool:
        return False

    def trouble(self) -> str | None:
        return None

    def swap(self, folder: Path) -> Served:
        meta = check_folder(folder)
        with swap_errors():
            self._engine.swap_model(self._init_kwargs(folder))  # BatcherError, the old model served, on failure
            return Served.of(folder, meta, time.time())
