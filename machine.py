"""What the machine can give the service, asked once at its start, before any worker is forked: whether its memory
holds the worker processes the config asks for (`check_workers`), and whether a CUDA GPU is usable where
`device=cuda` is asked for (`check_device`, in a child process).

Run where the service starts (server/gunicorn_conf.py, `python -m api`), not inside `config.Config`, which only reads
and validates settings. The bottom layer, beside config.py: the standard library and `config` only.
"""

from __future__ import annotations

from pathlib import Path

import config as settings
from config import Config, ConfigError

# What one more worker process costs in memory, rounded up from what it was measured to hold with the shipped model on
# CPU (0.68-0.94 GiB of RSS over an hour's soak, docs/benchmarks.md); a model process of the process engine holds one
# model too. The master holds torch and the model's modules, imported before it forks (0.54 GiB measured).
MODEL_PROCESS_BYTES = 1 << 30
MASTER_BYTES = 600 << 20


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process may still take: the kernel's MemAvailable, less where its cgroup's limit (a container's or
    a pod's memory limit: `memory.max` less `memory.current`) leaves less; None where neither can be read."""
    known: list[int] = []
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text(encoding="ascii").strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text(encoding="ascii").strip())
            known.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(known) if known else None


def check_workers(config: Config, available: int | None = None, cores: int | None = None) -> str | None:
    """Stop the start in one line when the machine's memory cannot hold `config.workers` worker processes, each with
    its model (or `batcher_workers` model processes); return a warning for more workers than usable cores, else None.

    Asked by gunicorn's master before it forks any worker: a count the memory cannot hold would fork worker after
    worker, each loading a model, until the machine ran out (`WEB_WORKERS=1000`, issue 46)."""
    models = config.batcher_workers if config.batcher_workers > 1 else 1
    needed = MASTER_BYTES + config.workers * models * MODEL_PROCESS_BYTES
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        fits = max(0, (available - MASTER_BYTES) // (models * MODEL_PROCESS_BYTES))
        gib = 2**30
        raise ConfigError(
            f"web_workers={config.workers} needs about {needed / gib:.1f} GiB ({config.workers} x {models} model(s) "
            f"of {MODEL_PROCESS_BYTES / gib:.1f} GiB and the master), but {available / gib:.1f} GiB is available "
            f"here: at most {fits} fit")
    cores = settings.usable_cores() if cores is None else cores  # looked up at the call: tests replace it
    if config.workers > cores:
        return (f"web_workers={config.workers} is more than the {cores} usable cores: the workers take turns on them "
                f"(one per core or fewer serves more, docs/deploy.md)")
    return None


# Run in a child process: initializing CUDA in a process that forks afterwards (gunicorn's master) leaves every
# child unable to use it ("Cannot re-initialize CUDA in forked subprocess"). The child answers what the workers'
# torch will find: the number of CUDA devices it can initialize, or why not.
_CUDA_PROBE = """
import sys
try:
    import torch
except ModuleNotFoundError:
    sys.exit("torch is not installed")
if torch.version.cuda is None:
    sys.exit(f"torch {torch.__version__} is a CPU build (make install-gpu installs the CUDA build)")
try:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as exc:
    sys.exit(f"torch {torch.__version__} cannot use CUDA: {exc}")
if not count:
    sys.exit(f"torch {torch.__version__} sees no usable CUDA GPU")
print(count)
"""


def check_device(config: Config, python: str | None = None) -> int:
    """Stop the start in one line when `device=cuda` is asked for and no worker could use a CUDA GPU; return the
    number of CUDA devices (0 for cpu and auto, which are never refused).

    The question is asked in a child process, never in this one: this one may be gunicorn's master, which must not
    initialize CUDA before it forks its workers (it would leave them unable to)."""
    if config.device != "cuda":
        return 0
    import subprocess
    import sys

    try:
        probe = subprocess.run([python or sys.executable, "-c", _CUDA_PROBE], capture_output=True, text=True,
                               timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"device=cuda was asked for, but CUDA could not be checked: {exc}") from None
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
        raise ConfigError(f"device must be auto or cpu here: cuda was asked for, but {lines[-1]}")
    return int(probe.stdout.strip() or 0)
