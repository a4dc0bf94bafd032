"""Start the service as `make run` does (gunicorn and its workers) on a free loopback port, and read its logs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from config import DEFAULT_WEIGHTS_DIR, REPO_ROOT
from model.weights_meta import WEIGHTS_FILES

APP = "api:create_app()"
# tests/fakes.py's FakeCorrector served as `make run` serves the model: to smoke-test a tool, its figures meaningless.
FAKE_APP = "tests.fakes:create_fake_app()"
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 180.0


def missing_weights(weights_dir: Path = DEFAULT_WEIGHTS_DIR) -> list[str]:
    """Name the files of the shipped corrector that are not in weights_dir."""
    return [name for name in WEIGHTS_FILES if not (weights_dir / name).is_file()]


def gunicorn_command(app: str = APP) -> list[str]:
    """Build the command `make run` uses, with this interpreter's gunicorn."""
    gunicorn = Path(sys.executable).parent / "gunicorn"
    runner = [str(gunicorn)] if gunicorn.exists() else [sys.executable, "-m", "gunicorn"]
    return [*runner, "-c", "server/gunicorn_conf.py", app]


T = TypeVar("T")


@contextlib.contextmanager
def sampling(read: Callable[[], T], every_s: float) -> Iterator[list[tuple[float, T]]]:
    """Note the wall-clock time and what `read` returns, every `every_s` on a thread while the block runs and once at
    its end, into the list yielded: readings between the moments of a load run, which the run does not pause for."""
    readings: list[tuple[float, T]] = []
    done = threading.Event()

    def sample() -> None:
        while True:
            readings.append((time.time(), read()))
            if done.wait(every_s):
                readings.append((time.time(), read()))
                return

    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    try:
        yield readings
    finally:
        done.set()
        sampler.join()


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all processes, all cores)."""
    times = psutil.cpu_times()  # on Linux guest time is already in user; steal is the hypervisor's
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


@dataclass
class CpuClock:
    """A server's CPU seconds and the machine's busy seconds (`machine_busy_s`) at wall-clock moments
    (`ServerProcess.cpu_clock`), read back at any moment between."""

    readings: list[tuple[float, tuple[float, float]]]  # (at, (cpu_s, busy_s))

    def between(self, start: float, end: float, machine: bool = False) -> float:
        """The server's CPU seconds (`machine`: the machine's busy seconds) from `start` to `end`, read linearly
        between samples (clamped to the first, last)."""
        times, values = [at for at, _ in self.readings], [pair[machine] for _, pair in self.readings]
        return float(np.interp(end, times, values) - np.interp(start, times, values))

    def figures(self, start: float, end: float, answers: int, own_pct: float = 0.0) -> dict[str, float | None]:
        """What the window cost the server: its share of one core and its CPU milliseconds per answer; and what the
        other processes took meanwhile (the machine's busy time less the server's and `own_pct`, the tool's), as a
        share of one core: figures compare only between runs where that is small."""
        seconds, cpu_s, busy_s = end - start, self.between(start, end), self.between(start, end, machine=True)
        return {"server_cpu_pct": round(100 * cpu_s / seconds, 1),
                "server_cpu_ms_per_answer": round(1000 * cpu_s / answers, 2) if answers else None,
                "others_cpu_pct": round(max(0.0, 100 * (busy_s - cpu_s) / seconds - own_pct), 1)}


@dataclass
class ServerProcess(contextlib.AbstractContextManager["ServerProcess"]):
    """A gunicorn server started by `start_server`, stopped at the end of a `with` block; its stdout and stderr go to
    `log_path`."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def process_tree(self) -> list[tuple[psutil.Process, str]]:
        """Every process of the server and its role: the gunicorn master, each of its workers (however many gunicorn
        runs), and every process under a worker (the model's processes with BATCHER_WORKERS > 1, their helpers)."""
        out = []
        with contextlib.suppress(psutil.NoSuchProcess):
            master = psutil.Process(self.process.pid)
            out.append((master, "master"))
            for child in master.children(recursive=True):  # one walk of /proc: cpu_s reads it 5 times a second
                with contextlib.suppress(psutil.NoSuchProcess):
                    out.append((child, "worker" if child.ppid() == master.pid else "model"))
        return out

    def cpu_s(self) -> float:
        """The CPU seconds (user + system) the master and every process under it have used so far."""
        total = 0.0
        for process, _ in self.process_tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    @contextlib.contextmanager
    def cpu_clock(self, every_s: float = 0.2) -> Iterator[CpuClock]:
        """Sample `cpu_s` and `machine_busy_s` while the block runs, to read the CPU used between two moments of it."""
        with sampling(lambda: (self.cpu_s(), machine_busy_s()), every_s) as readings:
            yield CpuClock(readings)

    def processes(self) -> list[dict[str, Any]]:
        """Every process of the server (`process_tree`), each with its role, pid, RSS (MiB), open file descriptors and
        threads."""
        out = []
        for process, role in self.process_tree():
            with contextlib.suppress(psutil.NoSuchProcess), process.oneshot():
                out.append({"pid": process.pid, "role": role, "rss_mib": round(process.memory_info().rss / 2**20, 1),
                            "fds": process.num_fds(), "threads": process.num_threads()})
        return out

    def log_offset(self) -> int:
        """Where the server's log ends now: `request_log` reads what comes after."""
        return self.log_path.stat().st_size

    def request_log(self, offset: int = 0) -> list[dict]:
        """Return the JSON lines of logger api.requests (one per inference request: `path`, `latency_ms`, ...) written
        from byte `offset` on, whole lines only: a long run reads its log in pieces, not whole every time."""
        with self.log_path.open("rb") as log:
            log.seek(offset)
            data = log.read()
        data = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        out = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    if record.get("logger") == "api.requests":
                        out.append(record)
        return out

    def paths(self, since: int = 0) -> Counter[str]:
        """Count the answers by path (model, cached, retry_top1, too_long, deadline, overload, ...)."""
        return Counter(line.get("path", "?") for line in self.request_log()[since:])

    def log_tail(self) -> str:
        """Return the end of the server's log (40 lines), for error messages."""
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stop gunicorn gracefully (SIGTERM to its master), killing it and its worker if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                for process, _ in reversed(self.process_tree()):  # the master last
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
                self.process.wait(5)
        return self.process.returncode


def start_server(settings: Mapping[str, str] | None = None, log_path: Path | None = None, app: str = APP,
                 tree: Path = REPO_ROOT, command: list[str] | None = None) -> ServerProcess:
    """Start gunicorn on a free loopback port with these settings (env) and wait for /readyz (ab.py: another `tree`)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HOST": LOOPBACK, "PORT": str(port), "PYTHONUNBUFFERED": "1", **(settings or {})}
    if log_path is None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"esun-server-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command or gunicorn_command(app), cwd=tree, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = ServerProcess(f"http://{LOOPBACK}:{port}", process, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while get_json(f"{server.url}/readyz", timeout_s=2) is None:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode} before it was ready; "
                                   f"log {log_path}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready after {READY_TIMEOUT_S:g} s; "
                                   f"log {log_path}:\n{server.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        server.stop(timeout_s=5)
        raise
    return server


def loopback_get(url: str, timeout_s: float = 10.0) -> requests.Response:
    """GET from a server started here, never through a proxy (the server is on loopback)."""
    with requests.Session() as http:
        http.trust_env = False
        return http.get(url, timeout=timeout_s)


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """GET a JSON document from a server started here; None unless a 200 with JSON came."""
    try:
        response = loopback_get(url, timeout_s)
        return response.json() if response.status_code == 200 else None
    except requests.RequestException:
        return None


def metric_samples(url: str) -> list[Any]:
    """The samples of a server's /metrics (none where it answers no 200 there: testing.ab serves older commits)."""
    response = loopback_get(f"{url}/metrics")
    text = response.text if response.status_code == 200 else ""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape(url: str, names: Mapping[str, str], **labels: str) -> dict[str, float]:
    """Read the samples `names` (series: key) with these labels from a server's /metrics, summed over its workers
    (several gunicorn workers label theirs `worker`); 0.0 for one not served."""
    out = dict.fromkeys(names.values(), 0.0)
    for sample in metric_samples(url):
        if sample.name in names and all(sample.labels.get(k) == v for k, v in labels.items()):
            out[names[sample.name]] += sample.value
    return out
