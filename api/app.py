"""The application factory: the one place that builds the service's objects from a `Config`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from flask import Flask

from api.admission import Admission
from api.answers import AnswerPolicy
from api.errors import register_error_handlers
from api.interfaces import Corrector, Engine, Prediction, batch_fn, size_of
from api.loading import LoadingCorrector
from api.logs import configure_logging
from api.metrics import METRICS_KEY, Metrics, instrument
from api.routes import register_routes
from api.state import EXTENSION_KEY, AppState
from api.swap import ModelSwapper, SwapCollector, resolve
from batching import Batcher
from cache import LayeredResultCache, build_cache
from config import Config
from model.contract import check_weights

log = logging.getLogger("api.app")

# What each worker process builds when batcher_workers > 1 (batching.process.ImportedModel's target).
CORRECTOR_TARGET = "model.corrector:Corrector"


def create_app(
    config: Config | None = None,
    corrector: Corrector | None = None,
    engine: Engine | None = None,
    make_admission: Callable[[Callable[[], int]], Admission] | None = None,
    cache: LayeredResultCache | None = None,
    build_corrector: Callable[[Path], Corrector] | None = None,
) -> Flask:
    """Build the Flask app with its corrector, engine (a batcher), answer cache and metrics.

    By default the config comes from the environment and the corrector is the real one from
    `model.corrector`, imported, loaded and warmed up (`setup()`) on a thread (`api.loading`): the app serves at
    once, answering TOP1 and `/readyz` 503 until the model is ready. An injected corrector (tests inject fakes)
    must be set up already, or be a started `LoadingCorrector`. An injected engine replaces the batcher built
    around the corrector. With `batcher_workers` > 1 and no injected corrector, the corrector is built in that many
    worker processes instead (`batching.process`), before this returns; the app then holds no corrector of its
    own (`AppState.corrector` is None) and the engine describes the model. The admission (`api.admission`) is
    built by `make_admission` from the engine's count of questions on the model (by default `Admission.from_config`;
    tests build one on a fake clock); the answer cache is built from the config unless injected (tests inject a
    cache on a fake Redis). Unless a corrector or an engine is injected, a `ModelSwapper` (`api.swap`) watches where
    `weights_dir` leads and swaps the folder it leads to in; `build_corrector(folder)` builds the set-up corrector
    of a folder, the first and each swapped in (by default the real one; tests inject fakes). Building the real
    corrector, it first checks the weights folder as the start-up does (`model.contract.check_weights`: ConfigError in
    one line).
    """
    config = config or Config.from_env()
    if corrector is None and engine is None:
        check_weights(config)
    configure_logging(config.log_level)
    metrics = Metrics(spool_dir=Path(config.shared_dir) / "metrics" if config.shared_dir else None)
    cache = cache or build_cache(config, observer=metrics)
    loader = swapper = None
    folder = resolve(config.weights_dir)  # WEIGHTS_DIR may be a symlink (api.swap): what it leads to now is loaded
    if corrector is None and engine is None and config.batcher_workers > 1:
        engine = build_process_batcher(config, metrics, target=CORRECTOR_TARGET, folder=folder)
        swapper = ModelSwapper(config.weights_dir, folder, None, None, config.weights_poll_s,
                               install=partial(_swap_processes, engine, config))
    else:
        if corrector is None:
            build = build_corrector or partial(_load_corrector, config)
            corrector = loader = LoadingCorrector(partial(build, folder))
            swapper = ModelSwapper(config.weights_dir, folder, loader, build, config.weights_poll_s,
                                   forget=None if build_corrector else _forget_shared)
        if engine is None:
            engine = _build_batcher(config, corrector, metrics)

    app = Flask(__name__)
    # One byte over the limit: werkzeug cuts a streamed (chunked) body there without saying so, and the view refuses
    # a body of more than max_body_bytes (api.routes.read_body) whichever way it came.
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes + 1
    app.json.ensure_ascii = False  # answers in UTF-8: shorter, and readable in logs
    admission = (make_admission or partial(Admission.from_config, config))(engine.in_flight)
    metrics.watch_admission(admission)
    metrics.watch_engine(engine)
    metrics.watch_cache(cache.local)
    answers = AnswerPolicy(config, cache, corrector, engine, admission, metrics)
    app.extensions[EXTENSION_KEY] = AppState(config=config, corrector=corrector, engine=engine, cache=cache,
                                             admission=admission, answers=answers, metrics=metrics, swapper=swapper)
    if swapper is not None:
        metrics.registry.register(SwapCollector(swapper))
    app.extensions[METRICS_KEY] = metrics
    register_error_handlers(app)
    register_routes(app)
    instrument(app)
    if not config.captain_email:
        # server_uuid is sha256(captain_email + str(int(utc_now)) + salt): without the email it names no team.
        log.warning("CAPTAIN_EMAIL is not set: server_uuid will not identify the team")
    log.info("app ready", extra={"fields": {"config": config.summary()}})
    if metrics.spool is not None:
        metrics.spool.start()
    if loader is not None:
        loader.start()  # last: the loading competes for the GIL with whatever this thread still does
    if swapper is not None:
        swapper.start()  # waits for the loader, then looks where WEIGHTS_DIR leads every WEIGHTS_POLL_S
    return app


def build_process_batcher(config: Config, metrics: Metrics, target: str, folder: Path | None = None) -> Engine:
    """Build `config.batcher_workers` worker processes, each with its own corrector built from `target`, on the
    weights in `folder` (by default where `config.weights_dir` leads now: every process the same folder, also one
    started later to replace a dead set)."""
    # Imported here: the process batcher starts processes, which the threaded default never needs.
    from batching.process import ImportedModel, ProcessBatcher

    devices = _devices(config)
    log.info("corrector runs in worker processes", extra={"fields": {
        "workers": config.batcher_workers, "cuda_devices": list(devices), "target": target,
        "batch_window_s": config.max_batch_wait_s}})  # a fixed window: batch_policy applies to one worker thread
    return ProcessBatcher(
        ImportedModel,
        model_init_kwargs=_process_init_kwargs(config, target, folder or resolve(config.weights_dir)),
        worker_num=config.batcher_workers,
        cuda_devices=devices or None,
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_batch_wait_s,
        max_in_flight=config.pool_cap,  # each question waits on a pool thread
        on_result=Prediction,
        on_batch=metrics.observe_batch,
        name="corrector",
    )


def _process_init_kwargs(config: Config, target: str, folder: Path) -> dict[str, Any]:
    """What each worker process builds its corrector from (`batching.process.ImportedModel.init_model`)."""
    # On CPU, share this worker's cores among its model processes instead of letting each torch take them all.
    env = {} if _devices(config) else {"OMP_NUM_THREADS": str(max(1, config.threads_per_worker
                                                                      // config.batcher_workers))}
    return {"target": target, "env": env,
            "kwargs": {"weights_dir": folder, "device": config.device,
                       "lm_path": config.lm_path if config.stage != "net" else None,
                       "stage": config.stage, "cpu_precision": config.cpu_precision,
                       "cpu_runtime": config.cpu_runtime, "masked_lm_dir": config.mlm_dir or None}}


def _swap_processes(engine: Engine, config: Config, folder: Path) -> None:
    """Serve `folder` from the process engine's workers, replaced one at a time (`batching.process_swap`)."""
    from batching.process import ProcessBatcher

    if not isinstance(engine, ProcessBatcher):
        raise TypeError(f"only the process engine swaps its worker processes, not {type(engine).__name__}")
    engine.swap_model(_process_init_kwargs(config, CORRECTOR_TARGET, folder))


def _devices(config: Config) -> tuple[str, ...]:
    return tuple(d.strip() for d in config.cuda_devices.split(",") if d.strip())


def preload(with_model: bool = True, config: Config | None = None) -> None:
    """Prepare a process that will fork workers: import the corrector's modules (torch) and read what every
    worker's setup reads alike (`model.corrector.preload`) when `with_model`, and build the routes once on a
    throwaway app, so that pydantic and spectree have generated the schemas. Starts no thread and touches no
    device (neither would survive a fork)."""
    if with_model:
        from model.corrector import preload as preload_model

        preload_model(config.weights_dir if config else None, with_lm=config is None or config.stage != "net")
    register_routes(Flask("preload"))


def _load_corrector(config: Config, folder: Path) -> Corrector:
    """Build and set up the corrector on the weights in `folder` (a folder, not a link that may move meanwhile)."""
    # Imported here, on the loader's thread: importing torch alone takes seconds. Tests with fakes never do.
    from model.corrector import Corrector

    corrector = Corrector(weights_dir=folder, device=config.device, threads=config.threads_per_worker,
                          cpu_precision=config.cpu_precision, cpu_runtime=config.cpu_runtime,
                          lm_path=config.lm_path if config.stage != "net" else None, stage=config.stage,
                          masked_lm_dir=config.mlm_dir or None)
    corrector.setup()
    return corrector


def _forget_shared(folder: Path) -> None:
    from model.corrector import forget_shared

    forget_shared(folder)


def _build_batcher(config: Config, corrector: Corrector, metrics: Metrics) -> Engine:
    return Batcher(
        batch_fn(corrector),
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_batch_wait_s,
        max_in_flight=config.pool_cap,  # each question waits on a pool thread
        policy=config.batch_policy,
        size_of=size_of,
        name="corrector",
        on_batch=metrics.observe_batch,
        stuck_after_s=config.batch_stuck_after_s,
    )
