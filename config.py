"""Every setting of the service, read once from the environment and validated at start.

Each setting is a field of `Config`; its environment variable is the field name in upper case (`PORT`,
`MAX_BATCH_SIZE`, `JUDGE_TIMEOUT_S`, ...). Units are part of the names: `_s` seconds, `_bytes` bytes,
`_chars` characters. `Config.from_env()` is the only place that reads the environment; the rest of the
code receives a `Config`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

REPO_ROOT = Path(__file__).resolve().parent
DEFAULT_WEIGHTS_DIR = REPO_ROOT / "model" / "weights"
DEFAULT_LM_PATH = REPO_ROOT / "model" / "lm" / "zh_CN.lm"

BATCH_POLICIES = ("adaptive", "fixed")
DEVICES = ("auto", "cpu", "cuda")
STAGES = ("full", "lm", "net")
CPU_PRECISIONS = ("int8", "fp32")
CPU_RUNTIMES = ("torch", "onnx")
# Threads of a worker beyond the pool's cap, by default: /healthz, /readyz, /metrics, / while the pool is full.
SPARE_THREADS = 32
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Settings no log, summary or --help shows.
SECRET_FIELDS = frozenset({"server_uuid_salt", "redis_url"})
# Choice settings are matched case-insensitively: LOG_LEVEL=info and DEVICE=CPU both work.
_CASE_FOLDS = {"log_level": str.upper, "batch_policy": str.lower, "device": str.lower, "stage": str.lower,
               "cpu_precision": str.lower, "cpu_runtime": str.lower}


# Settings that existed once, with what took their place: set in the environment, they stop the start in one line.
REMOVED_SETTINGS = {
    "POOL_LIMIT": "the thread pool holds two batches' worth of requests (set MAX_BATCH_SIZE)",
    "MAX_IN_FLIGHT": "questions on the model are bounded by the thread pool, two batches' worth (set "
                     "MAX_BATCH_SIZE): each waits on a pool thread, so a higher bound could never act",
    "OVERLOAD_INTERVAL_S": "the overload control's interval is fixed at 100 ms (OVERLOAD_TARGET_S sets how it acts)",
    "OVERLOAD_MODEL_SHARE": "the overload control's model-wait target is half the budget (OVERLOAD_TARGET_S sets "
                            "how it acts; JUDGE_TIMEOUT_S and SAFETY_MARGIN_S the budget)",
}


class ConfigError(ValueError):
    """A setting is missing, malformed or out of range; the message names the setting."""


@dataclass(frozen=True)
class Config:
    """The service's settings; see the module docstring for the environment variables."""

    host: str = "0.0.0.0"
    port: int = 8080
    # Batching: at most this many questions per model call, waiting at most this long to fill one.
    max_batch_size: int = 64
    max_batch_wait_s: float = 0.15
    batch_policy: str = "adaptive"
    # A batch running longer than this makes /readyz say so (503); its waiters answer TOP1 at their deadline.
    batch_stuck_after_s: float = 2.0
    # The judge's HTTP timeout; answers are due `safety_margin_s` before it (network, JSON, scheduling).
    judge_timeout_s: float = 1.0
    safety_margin_s: float = 0.25
    # A request with less of its budget left when its view starts (it waited for a thread since its accept)
    # answers TOP1 at once: about one batch of 64 on 2 cores (124 ms), which is what the model needs when it
    # is busy, and a view that starts this late means it is.
    min_model_budget_s: float = 0.1
    # Overload control (api/admission.py): while even the least-queued request of two 100 ms intervals in a row
    # waited longer than this between accept and view, or the quickest model answer longer than half the budget, the
    # model's share is halved (new arrivals answer TOP1, path `shed`); it grows back when the queues are gone. 0: off.
    overload_target_s: float = 0.05
    # What the model is asked about (api.answers: a longer TOP1 is answered TOP1, path `too_long`), and how much of
    # a request is read (api.schemas: later hypotheses past these limits are dropped; a larger body is refused 413).
    max_top1_chars: int = 45
    max_hypotheses: int = 10
    max_chars_per_hypothesis: int = 200
    max_body_bytes: int = 64 * 1024
    # gunicorn's event loop reads each request whole before a thread serves it (server/worker.py); a connection
    # whose request is not whole this long after its accept (or its first byte, kept alive) is closed unanswered.
    request_read_timeout_s: float = 5.0
    # Answers kept for retries, keyed by esun_uuid.
    cache_size: int = 100_000
    cache_ttl_s: float = 3600.0
    redis_url: str = ""
    # gunicorn worker processes, each with its own thread pool, batcher and model (one process's GIL caps what it
    # serves). 0: chosen from the machine, one per core the process may use (2 on a 2-core machine: docs/deploy.md).
    web_workers: int = 0
    # A folder the worker processes of one server share when there are several: the answers kept for retries (a
    # SQLite file, unless redis_url is set) and each worker's metrics. Empty: gunicorn's master makes one for its
    # workers and removes it at exit.
    shared_dir: str = ""
    # 1: batches run on a thread of the server process. More: that many worker processes (service-streamer's
    # Streamer), each with its own model, placed round robin on `cuda_devices` (comma-separated ids, e.g. "0,1").
    batcher_workers: int = 1
    cuda_devices: str = ""
    # Model.
    device: str = "auto"
    # torch's intra-op CPU threads per worker process; 0: the cores it may use shared among the web workers.
    torch_threads: int = 0
    # On CPU, the network's linear layers in int8 (model/corrector.py: torch's dynamic quantization) or fp32.
    # On CUDA it runs in half precision either way.
    cpu_precision: str = "int8"
    # On CPU, what runs the network: torch (TorchScript) or ONNX Runtime (model/runtime.py: exported at set-up; torch
    # where it cannot). On CUDA torch runs it either way.
    cpu_runtime: str = "torch"
    weights_dir: Path = field(default=DEFAULT_WEIGHTS_DIR)
    # How often each worker looks where weights_dir leads (a symlink: `ln -sfn new current` swaps the model in under
    # traffic, hosting/swap.py); 0: never, the folder read at start is served until a restart.
    weights_poll_s: float = 1.0
    # The word trigram (KenLM binary) of the second stage, and which stages answer: full (network, then
    # whole sentences reranked with the LM), lm (LM rescoring of the n-best alone), net (the network alone).
    lm_path: Path = field(default=DEFAULT_LM_PATH)
    stage: str = "full"
    # A team's Hugging Face masked-LM folder (model/masked_lm.py), read from the folder alone; used where the served
    # weights' second stage was fitted with it (make adapt ... MLM_DIR=DIR), ignored with a warning elsewhere.
    mlm_dir: str = ""
    # server_uuid = sha256(captain_email + str(int(utc_now)) + server_uuid_salt), as the organiser's template.
    captain_email: str = ""
    server_uuid_salt: str = ""
    log_level: str = "INFO"
    # gunicorn: this many threads in each worker process; 0: the pool's cap (two batches) and SPARE_THREADS more.
    http_threads: int = 0
    graceful_timeout_s: float = 30.0
    worker_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def pool_cap(self) -> int:
        """/inference requests the thread pool holds at once: two batches' worth, the one running and the next one
        filling; past it the worker's event loop answers (api/admission.py: TOP1, path `pool_full`). Also the
        batcher's bound on questions on the model (each waits on a pool thread; past it, path `overload`).

        One batch's worth (what half of 128 threads gave until issue 46) turned arrivals away far below capacity: a
        batch held open for `max_batch_size` items filled the pool, and every arrival while it ran was refused
        (docs/benchmarks.md, issue 46). A thread waiting on its future holds no GIL; the threads above the cap serve
        the probes."""
        return 2 * self.max_batch_size

    @property
    def threads(self) -> int:
        """gunicorn's threads per worker: `http_threads`, or the pool's cap and `SPARE_THREADS` for the probes."""
        return self.http_threads or self.pool_cap + SPARE_THREADS

    @property
    def workers(self) -> int:
        """gunicorn worker processes: `web_workers`, or when 0 one per core this process may use, each with one torch
        thread: one process's GIL caps what it serves, and on 2 cores two workers served more than one with two torch
        threads, open loop and closed (docs/benchmarks.md, issue 46)."""
        return self.web_workers or usable_cores()

    @property
    def threads_per_worker(self) -> int:
        """torch's intra-op threads in each worker: `torch_threads`, or the usable cores shared among the workers."""
        return self.torch_threads or max(1, usable_cores() // self.workers)

    @property
    def budget_s(self) -> float:
        """Seconds from a request's arrival until its answer is due."""
        return self.judge_timeout_s - self.safety_margin_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Config:
        """Build the config from environment variables named after the fields in upper case."""
        removed = [f"{name} was removed: {successor}" for name, successor in REMOVED_SETTINGS.items()
                   if name in environ]
        if removed:
            raise ConfigError("; ".join(removed))
        raw = {name: environ[name.upper()] for name in _field_types() if name.upper() in environ}
        return cls().with_overrides(raw)

    @staticmethod
    def misspelled(environ: Mapping[str, str] = os.environ) -> list[str]:
        """One warning line for each environment variable one edit away from a setting's name that is not a setting
        (`MAX_BATCH_SIZ=8`): read by no one, it would be silently ignored."""
        names = {name.upper() for name in _field_types()} | set(REMOVED_SETTINGS)
        return [f"{var} is not a setting (ignored): did you mean {near}?" for var in sorted(environ)
                if var not in names and len(var) > 3
                for near in sorted(n for n in names if _one_edit_apart(var, n))[:1]]

    def with_overrides(self, raw: Mapping[str, str]) -> Config:
        """Return a copy with some settings replaced by values given as strings (env or CLI)."""
        types = _field_types()
        unknown = sorted(set(raw) - set(types))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        values = {name: _coerce(name, value, types[name]) for name, value in raw.items()}
        return dataclasses.replace(self, **values)

    def summary(self) -> dict[str, Any]:
        """Describe the settings for humans, without secrets."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                out[f.name] = "<set>" if value else ""
            else:
                out[f.name] = str(value) if isinstance(value, Path) else value
        out["budget_s"] = self.budget_s
        out["pool_cap"] = self.pool_cap
        out["threads"] = self.threads
        out["workers"] = self.workers
        return out


def usable_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use, at least 1: those it may run on (its CPU affinity, which a container's cpuset
    narrows), fewer where its cgroup's CPU quota allows less (a container's or a Kubernetes pod's CPU limit: `cpu.max`
    holds "quota period", or "max period" for none), rounded up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text(encoding="ascii").split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2 here, or a file not in its format
        pass
    return max(1, cores)


def _where_a_link_leads(path: Path) -> str:
    """What a dangling symlink says (empty for anything else): its target, read from the link's own folder."""
    if not path.is_symlink():
        return ""
    target = os.readlink(path)
    return (f", a symlink to {target!r}, which leads to {os.path.realpath(path)!r}: no such folder (a relative "
            f"target is read from the link's folder, {str(path.parent)!r})")


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether one insertion, deletion, substitution or swap of two neighbours turns `a` into `b` (`a` != `b`)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    if len(a) < len(b):
        return a[i:] == b[i + 1:]
    return a[i + 1:] == b[i + 1:] or (a[i + 2:] == b[i + 2:] and a[i:i + 2] == b[i:i + 2][::-1])


def _field_types() -> dict[str, type]:
    return get_type_hints(Config)


def _coerce(name: str, raw: str, kind: type) -> Any:
    text = raw.strip()
    try:
        if kind is int:
            return int(text)
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
    except ValueError:
        raise ConfigError(f"{name} must be a{'n integer' if kind is int else ' number'}, got {raw!r}") from None
    if kind is Path:
        return Path(text).expanduser()
    return _CASE_FOLDS.get(name, str)(text)


def _validate(c: Config) -> None:
    _at_least(c, "port", 0)
    if c.port > 65535:
        raise ConfigError(f"port must be <= 65535, got {c.port}")
    _at_least(c, "web_workers", 0)
    for name in ("max_batch_size", "max_top1_chars", "max_hypotheses",
                 "max_chars_per_hypothesis", "max_body_bytes", "cache_size", "batcher_workers"):
        _at_least(c, name, 1)
    for name in ("max_batch_wait_s", "safety_margin_s", "min_model_budget_s", "overload_target_s", "weights_poll_s"):
        _at_least(c, name, 0)
    _at_least(c, "torch_threads", 0)
    _at_least(c, "http_threads", 0)
    for name in ("judge_timeout_s", "cache_ttl_s", "graceful_timeout_s", "worker_timeout_s", "batch_stuck_after_s",
                 "request_read_timeout_s"):
        _positive(c, name)
    _one_of(c, "batch_policy", BATCH_POLICIES)
    _one_of(c, "device", DEVICES)
    _one_of(c, "stage", STAGES)
    _one_of(c, "cpu_precision", CPU_PRECISIONS)
    _one_of(c, "cpu_runtime", CPU_RUNTIMES)
    if not c.weights_dir.is_dir():
        raise ConfigError(f"weights_dir must name an existing weights folder, got {str(c.weights_dir)!r}"
                          + _where_a_link_leads(c.weights_dir))
    # what the folder holds is checked at start-up, beside the device (model.contract.check_weights)
    if c.stage != "net" and not c.lm_path.is_file():
        raise ConfigError(f"lm_path must name an existing KenLM file, got {str(c.lm_path)!r}")
    if c.mlm_dir and not Path(c.mlm_dir).expanduser().is_dir():
        raise ConfigError(f"mlm_dir must name an existing masked-LM folder, got {c.mlm_dir!r}")
    _one_of(c, "log_level", LOG_LEVELS)
    if c.budget_s <= 0:
        raise ConfigError(
            f"budget_s (judge_timeout_s - safety_margin_s) must be > 0, got {c.budget_s:g}"
            f" (judge_timeout_s={c.judge_timeout_s:g}, safety_margin_s={c.safety_margin_s:g})"
        )
    if c.max_batch_wait_s >= c.budget_s:
        # A batch that waits longer than the budget would turn every request into a TOP1 answer.
        raise ConfigError(f"max_batch_wait_s must be < budget_s ({c.budget_s:g}), got {c.max_batch_wait_s:g}")
    if c.min_model_budget_s >= c.budget_s:
        # Every request would answer TOP1 without asking the model.
        raise ConfigError(f"min_model_budget_s must be < budget_s ({c.budget_s:g}), got {c.min_model_budget_s:g}")
    if c.overload_target_s >= c.budget_s:
        # A queue that long already spends the whole budget: the control could never act in time.
        raise ConfigError(f"overload_target_s must be < budget_s ({c.budget_s:g}), got {c.overload_target_s:g}")
    if c.max_top1_chars > c.max_chars_per_hypothesis:
        raise ConfigError(
            f"max_top1_chars must be <= max_chars_per_hypothesis ({c.max_chars_per_hypothesis}),"
            f" got {c.max_top1_chars}"
        )
    if c.http_threads and c.http_threads < c.pool_cap:
        # Fewer threads than the pool's cap: the pool would never be full, and requests would wait for a thread.
        raise ConfigError(f"http_threads must be 0 (automatic) or >= 2 * max_batch_size ({c.pool_cap}), "
                          f"got {c.http_threads}")
    if c.cuda_devices and not all(d.strip() for d in c.cuda_devices.split(",")):
        raise ConfigError(f"cuda_devices must be comma-separated device ids like '0,1', got {c.cuda_devices!r}")
    if not c.host:
        raise ConfigError("host must not be empty")
    _check_redis_url(c.redis_url)
    _check_shared_dir(c.shared_dir)


REDIS_SCHEMES = ("redis", "rediss", "unix")


def _check_redis_url(url: str) -> None:
    """A Redis URL as redis-py reads it, or empty; its value is never shown (it may hold a password)."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        raise ConfigError("redis_url is not a URL redis can read (e.g. redis://host:6379/0)") from None
    if parts.scheme not in REDIS_SCHEMES:
        found = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ConfigError(f"redis_url must be a redis://, rediss:// or unix:// URL (e.g. redis://host:6379/0), got "
                          f"one with {found}")


def _check_shared_dir(folder: str) -> None:
    """A folder, or a new one to make in an existing folder, or empty (the master makes one)."""
    if not folder:
        return
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"shared_dir must name a folder, got {folder!r}, which is a file")
    if not path.exists() and not path.absolute().parent.is_dir():
        raise ConfigError(f"shared_dir must name a folder or a new one in an existing folder, got {folder!r}, "
                          f"whose parent {str(path.absolute().parent)!r} does not exist")


def _at_least(c: Config, name: str, low: float) -> None:
    value = getattr(c, name)
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


def _positive(c: Config, name: str) -> None:
    value = getattr(c, name)
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def _one_of(c: Config, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(c, name)
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
