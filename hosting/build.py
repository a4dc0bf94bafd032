"""The host built from a `Config`: the corrector in this process behind the threaded batcher, or in the process
engine's worker processes (`batching.process`) when `batcher_workers` > 1, on the folder `weights_dir` leads to now,
with a watcher of where it leads next (`hosting.swap`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from batching import Batcher, BatchReport
from config import Config
from hosting.host import InProcessHost, ModelHost, ProcessHost
from hosting.interfaces import Corrector, Engine, Prediction, batch_fn, size_of
from hosting.loading import LoadingCorrector
from hosting.served import resolve
from model.contract import check_weights

log = logging.getLogger("hosting.build")

# What each worker process builds when batcher_workers > 1 (batching.process.ImportedModel's target).
CORRECTOR_TARGET = "model.corrector:Corrector"

OnBatch = Callable[[BatchReport], None]


def build_host(config: Config, on_batch: OnBatch, corrector: Corrector | None = None, engine: Engine | None = None,
               build_corrector: Callable[[Path], Corrector] | None = None) -> ModelHost:
    """Build the host `config` asks for, not started (`ModelHost.start`). An injected `corrector` (set up already,
    or a started `LoadingCorrector`) or `engine` is served as it is, with no watcher (tests inject fakes);
    `build_corrector(folder)` replaces the real corrector's builder, for the first folder and each swapped in."""
    if corrector is not None or engine is not None:
        if corrector is None:
            raise ValueError("an injected engine needs its corrector (set up, or a started LoadingCorrector)")
        return InProcessHost(corrector, engine or build_batcher(config, corrector, on_batch))
    check_weights(config)  # as at the start's check: ConfigError in one line
    folder = resolve(config.weights_dir)  # WEIGHTS_DIR may be a symlink: what it leads to now is loaded
    host: InProcessHost | ProcessHost
    if config.batcher_workers > 1 and build_corrector is None:
        host = ProcessHost(build_process_batcher(config, on_batch, CORRECTOR_TARGET, folder),
                           partial(process_init_kwargs, config, CORRECTOR_TARGET))
    else:
        build = build_corrector or partial(load_corrector, config)
        loader = LoadingCorrector(partial(build, folder))
        host = InProcessHost(loader, build_batcher(config, loader, on_batch), build,
                             forget=None if build_corrector else forget_shared)
    host.watch(config.weights_dir, folder, config.weights_poll_s)
    return host


def load_corrector(config: Config, folder: Path) -> Corrector:
    """Build and set up the corrector on the weights in `folder` (a folder, not a link that may move meanwhile)."""
    # Imported here, on the loader's thread: importing torch alone takes seconds. Tests with fakes never do.
    from model.corrector import Corrector

    corrector = Corrector(weights_dir=folder, device=config.device, threads=config.threads_per_worker,
                          cpu_precision=config.cpu_precision, cpu_runtime=config.cpu_runtime,
                          lm_path=config.lm_path if config.stage != "net" else None, stage=config.stage,
                          masked_lm_dir=config.mlm_dir or None)
    corrector.setup()
    return corrector


def forget_shared(folder: Path) -> None:
    """Drop what was read for other folders than `folder`, now served (`model.corrector.forget_shared`)."""
    from model.corrector import forget_shared as forget

    forget(folder)


def build_batcher(config: Config, corrector: Corrector, on_batch: OnBatch) -> Engine:
    """The threaded batcher around `corrector`."""
    return Batcher(
        batch_fn(corrector),
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_batch_wait_s,
        max_in_flight=config.pool_cap,  # each question waits on a pool thread
        policy=config.batch_policy,
        size_of=size_of,
        name="corrector",
        on_batch=on_batch,
        stuck_after_s=config.batch_stuck_after_s,
    )


def build_process_batcher(config: Config, on_batch: OnBatch, target: str, folder: Path | None = None) -> Any:
    """Build `config.batcher_workers` worker processes, each with its own corrector built from `target`, on the
    weights in `folder` (by default where `config.weights_dir` leads now: every process the same folder, also one
    started later to replace a dead set). Returns a `batching.process.ProcessBatcher`."""
    # Imported here: the process batcher starts processes, which the threaded default never needs.
    from batching.process import ImportedModel, ProcessBatcher

    devices = _devices(config)
    log.info("corrector runs in worker processes", extra={"fields": {
        "workers": config.batcher_workers, "cuda_devices": list(devices), "target": target,
        "batch_window_s": config.max_batch_wait_s}})  # a fixed window: batch_policy applies to one worker thread
    return ProcessBatcher(
        ImportedModel,
        model_init_kwargs=process_init_kwargs(config, target, folder or resolve(config.weights_dir)),
        worker_num=config.batcher_workers,
        cuda_devices=devices or None,
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_batch_wait_s,
        max_in_flight=config.pool_cap,  # each question waits on a pool thread
        on_result=Prediction,
        on_batch=on_batch,
        name="corrector",
    )


def process_init_kwargs(config: Config, target: str, folder: Path) -> dict[str, Any]:
    """What each worker process builds its corrector from (`batching.process.ImportedModel.init_model`)."""
    # On CPU, share this worker's cores among its model processes instead of letting each torch take them all.
    env = {} if _devices(config) else {"OMP_NUM_THREADS": str(max(1, config.threads_per_worker
                                                                      // config.batcher_workers))}
    return {"target": target, "env": env,
            "kwargs": {"weights_dir": folder, "device": config.device,
                       "lm_path": config.lm_path if config.stage != "net" else None,
                       "stage": config.stage, "cpu_precision": config.cpu_precision,
                       "cpu_runtime": config.cpu_runtime, "masked_lm_dir": config.mlm_dir or None}}


def _devices(config: Config) -> tuple[str, ...]:
    return tuple(d.strip() for d in config.cuda_devices.split(",") if d.strip())
