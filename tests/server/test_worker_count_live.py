"""gunicorn for real with a worker count the machine cannot hold, more workers than cores, and SIGTERM to a master
whose workers are still loading their model (issue 46: `WEB_WORKERS=1000` forked worker after worker until the
memory was gone, and SIGTERM did not stop the master)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from config import usable_cores
from tests.faults.test_graceful_shutdown import GUNICORN, REPO_ROOT, free_port

pytestmark = pytest.mark.live

GRACEFUL_TIMEOUT_S = 3.0


def start(tmp_path: Path, **settings: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "server.log"
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(free_port()), "MAX_BATCH_SIZE": "8",
           "GRACEFUL_TIMEOUT_S": str(GRACEFUL_TIMEOUT_S), "LOG_LEVEL": "INFO", **settings}
    with log.open("wb") as out:
        process = subprocess.Popen([str(GUNICORN), "-c", "server/gunicorn_conf.py",
                                    "tests.fakes:create_slow_loading_app()"],
                                   cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, log


def test_a_worker_count_the_memory_cannot_hold_stops_the_start_in_one_line_before_any_fork(tmp_path: Path):
    process, log = start(tmp_path, WEB_WORKERS="1000")
    try:
        assert process.wait(timeout=30) == 2
    finally:
        process.kill()
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1, lines
    line = json.loads(lines[0])
    assert line["level"] == "ERROR"
    assert line["msg"].startswith("config error: web_workers=1000 needs about")
    assert "Booting worker" not in log.read_text()


def test_more_workers_than_cores_start_with_one_warning(tmp_path: Path):
    workers = usable_cores() + 1
    process, log = start(tmp_path, WEB_WORKERS=str(workers), LOAD_DELAY_S="0")
    try:
        deadline = time.monotonic() + 30
        while log.read_text().count("Booting worker") < workers and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    warnings = [json.loads(line) for line in log.read_text().splitlines() if '"WARNING"' in line]
    assert [w["msg"] for w in warnings if "usable cores" in w["msg"]] == [
        f"web_workers={workers} is more than the {usable_cores()} usable cores: the workers take turns on them "
        "(one per core or fewer serves more, docs/deploy.md)"]


def test_sigterm_stops_a_master_whose_workers_are_still_loading_within_the_graceful_timeout(tmp_path: Path):
    process, log = start(tmp_path, WEB_WORKERS="3", LOAD_DELAY_S="60")
    try:
        deadline = time.monotonic() + 30
        while log.read_text().count("Booting worker") < 3 and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        children = psutil.Process(process.pid).children()
        assert len(children) == 3
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=GRACEFUL_TIMEOUT_S + 5) == 0
        took_s = time.monotonic() - sent
    finally:
        process.kill()
    assert took_s < GRACEFUL_TIMEOUT_S + 1.5, f"SIGTERM took {took_s:.1f} s with the workers loading"
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
