"""docs/architecture.md lists the files one model answer passes through: these runs answer one and compare.

A profiler on every thread records the project files whose functions run while one question is answered by the
model. Flask's test client runs everything but the gunicorn seam: with a fake corrector (fast) it measures the
`api/`, `sidecar/`, `batching/` and `cache/` rows, with the shipped model (`real_model`) every row but the seam's. The
seam's rows (`server/`) are measured in a live gunicorn as `make run` starts it, its worker traced the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask

from config import REPO_ROOT
from tests.deploy.procs import free_port, readyz_status, stop, wait_for

PAGE = REPO_ROOT / "docs" / "architecture.md"
SEAM = ("server/",)
MODEL = ("model/", "preprocess/")
# The traced question is not the warm-up's: the model's caches would answer a list they have seen in part
TRACED = ["我 想 查詢 信用卡 帳單", "我 想 查尋 信用卡 賬單", "我 像 查詢 信用卡 帳單", "我 想 查詢 性用卡 帳單"]


def documented_files() -> set[str]:
    section = PAGE.read_text(encoding="utf-8").split("## The files a model answer passes through", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return {name for row in rows for name in re.findall(r"`([a-z_/]+\.py)`", row)}


def _answered_files(build: Callable[[], Flask], body: Callable[..., dict[str, Any]],
                    request_paths: Callable[[], list[str]]) -> set[str]:
    """Build the app, answer one warm-up question once it is ready, then trace the project files run while a second
    one is answered."""
    seen: set[str] = set()
    tracing = threading.Event()
    root = str(REPO_ROOT)

    def profile(frame, event, _arg):  # type: ignore[no-untyped-def]
        name = frame.f_code.co_filename
        if tracing.is_set() and event == "call" and name.startswith(root) and "/.venv/" not in name:
            seen.add(str(Path(name).relative_to(REPO_ROOT)))

    threading.setprofile(profile)  # before the app starts its batch thread, so that it is traced too
    try:
        client = build().test_client()
        deadline = time.monotonic() + 120  # the shipped model loads on a thread of its own
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        client.post("/inference", json=body(esun_uuid="warm"))
        sys.setprofile(profile)
        tracing.set()
        client.post("/inference", json=body(TRACED, esun_uuid="traced"))
        tracing.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert request_paths()[-1] == "model"
    return {f for f in seen if not f.startswith(("tests/", "testing/"))}


def test_the_page_counts_the_files_its_table_lists():
    """Regression: the page said 32 files in all while its table listed 33 (the heap module added to a row)."""
    section = PAGE.read_text(encoding="utf-8").split("## The files a model answer passes through", 1)[1]
    [count] = re.findall(r"(\d+) files in all", section)
    assert int(count) == len(documented_files())


def test_the_api_sidecar_batching_and_cache_rows_are_the_files_a_model_answer_runs(make_app, make_body, request_paths):
    served = _answered_files(make_app, make_body, request_paths)  # a fake corrector: the model's rows are not run
    assert {f for f in served if not f.startswith(MODEL)} == {f for f in documented_files()
                                                                 if not f.startswith(SEAM + MODEL)}


@pytest.mark.real_model
def test_every_row_but_the_seam_is_the_files_a_shipped_model_answer_runs(make_app, make_body, request_paths,
                                                                          config):
    import compiled
    from model.corrector import Corrector

    if any(compiled.used().values()):
        # compiled code runs no Python frame a profiler sees: the same test, in a child where the same code runs
        # interpreted (compiled.OFF)
        child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                f"{__file__}::test_every_row_but_the_seam_is_the_files_a_shipped_model_answer_runs"],
                               cwd=REPO_ROOT, env={**os.environ, compiled.OFF: "1"}, capture_output=True, text=True,
                               timeout=600)
        assert child.returncode == 0 and child.stdout.splitlines()[-1].startswith("1 passed"), child.stdout[-3000:]
        return

    # a budget the profiled model answers within (every call of every thread goes through the profiler)
    patient = dataclasses.replace(config, judge_timeout_s=60.0, safety_margin_s=1.0)
    corrector = Corrector(device="cpu")
    corrector.setup()
    served = _answered_files(lambda: make_app(patient, corrector=corrector), make_body, request_paths)
    assert served == {f for f in documented_files() if not f.startswith(SEAM)}


# The worker of a gunicorn started as `make run` starts it, with a profiler that notes when each function of the
# seam's files ran; the notes are written when the worker exits.
TRACED_GUNICORN = """
import atexit, json, os, sys, threading, time
root = os.path.join(os.getcwd(), "server") + os.sep
calls = {}
def profile(frame, event, _arg):
    name = frame.f_code.co_filename
    if event == "call" and name.startswith(root):
        calls.setdefault(name, []).append(time.monotonic())
sys.setprofile(profile)
threading.setprofile(profile)
atexit.register(lambda: open(f"{os.environ['TRACE_OUT']}.{os.getpid()}", "w").write(json.dumps(calls)))
from gunicorn.app.wsgiapp import run
sys.argv = ["gunicorn", *sys.argv[1:]]
run()
"""


@pytest.mark.live
def test_the_seam_rows_are_the_server_files_a_live_gunicorn_runs_for_an_answer(tmp_path, make_body):
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "TRACE_OUT": str(tmp_path / "calls"),
           "FAKE_DELAY_S": "0.005"}
    process = subprocess.Popen([sys.executable, "-c", TRACED_GUNICORN, "-c", "server/gunicorn_conf.py",
                                "tests.fakes:create_fake_app()"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: readyz_status(port) == 200, "traced gunicorn /readyz", process, timeout_s=60.0)
        url = f"http://127.0.0.1:{port}/inference"
        assert requests.post(url, json=make_body(esun_uuid="warm"), timeout=30).status_code == 200
        started = time.monotonic()
        answer = requests.post(url, json=make_body(esun_uuid="traced"), timeout=30)
        ended = time.monotonic()
        assert answer.status_code == 200 and answer.json()["answer"].startswith("改")  # the fake model's answer
    finally:
        stop(process)
    calls: dict[str, list[float]] = {}
    for notes in tmp_path.glob("calls.*"):
        for name, times in json.loads(notes.read_text()).items():
            calls.setdefault(name, []).extend(times)
    ran = {str(Path(name).relative_to(REPO_ROOT)) for name, times in calls.items()
           if any(started <= t <= ended for t in times)}
    assert ran == {f for f in documented_files() if f.startswith(SEAM)}
