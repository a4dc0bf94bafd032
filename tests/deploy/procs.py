"""Starting and stopping the real processes of the deployment tests (redis-server, nginx, gunicorn)."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run deploy/install_tools.sh (make test runs it first)"
GUNICORN = Path(sys.executable).parent / "gunicorn"


@dataclass(frozen=True)
class LiveServer:
    """A gunicorn a test started: its loopback port and the file its stderr (the JSON log) goes to."""

    port: int
    log: Path


def find_tool(name: str) -> str:
    """Return the path of a system tool, failing the test with the install hint when it is missing."""
    path = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.fail(f"{name} not found: {INSTALL_HINT}", pytrace=False)
    return path


def free_port() -> int:
    """Return a loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes] | None = None,
             timeout_s: float = 15.0) -> None:
    """Poll check until it is true; fail naming `what` (with the process's output if it exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AssertionError(f"{what}: process exited with {process.returncode}: {output[-3000:]}")
        try:
            if check():
                return
        except Exception:  # not up yet: refused, reset, a client library's own connection error
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what}: not ready within {timeout_s} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate a process this test started, killing it if it does not exit."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def readyz_status(port: int) -> int:
    """Return the status of GET /readyz on a loopback port."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status
    finally:
        connection.close()


@contextmanager
def gunicorn(app: str, port: int, log: Path, settings: dict[str, str],
             preexec_fn: Callable[[], None] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Serve `app` with gunicorn as `make run` does (server/gunicorn_conf.py) on a loopback port, with `settings` in
    its environment and its stderr (the JSON log) in `log`; yield once /readyz is 200, stop it after."""
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", **settings}
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", app],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=preexec_fn,
        )
    try:
        wait_for(lambda: readyz_status(port) == 200, "gunicorn /readyz", process, timeout_s=30.0)
        yield process
    finally:
        stop(process)
