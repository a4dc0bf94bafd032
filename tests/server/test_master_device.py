"""gunicorn's master never initializes CUDA: a worker forked from a master that did could not use it.

The master's start-up (server/gunicorn_conf.py read as gunicorn reads it, then its `on_starting` hook: the config,
the device check, the preload) runs in a child Python where `torch.cuda` is a stand-in that records every call and
says a GPU is there; the child prints what was called. The device check's own question runs in a grandchild
(machine.check_device), which the stand-in answers for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from config import REPO_ROOT, Config, ConfigError
from machine import check_device

MASTER_START = r"""
import json, runpy, subprocess, sys, types
import torch

calls = []

def recorder(name, result=None):
    def record(*args, **kwargs):
        calls.append(name)
        return result
    return record

for name, result in [("is_available", True), ("device_count", 1), ("init", None), ("_lazy_init", None),
                     ("current_device", 0), ("set_device", None), ("synchronize", None),
                     ("get_device_properties", None), ("get_device_name", "stand-in"), ("mem_get_info", (1, 1))]:
    setattr(torch.cuda, name, recorder(name, result))
probes = []
real_run = subprocess.run

def run(args, *rest, **kwargs):  # the device check's child: answered for, as a machine with one GPU would
    if args[1:2] == ["-c"] and "torch.cuda" in args[2]:
        probes.append(args[0])
        return subprocess.CompletedProcess(args, 0, "1\n", "")
    return real_run(args, *rest, **kwargs)

subprocess.run = run
settings = runpy.run_path("server/gunicorn_conf.py")
server = types.SimpleNamespace(app=types.SimpleNamespace(app_uri="api:create_app()"),
                               cfg=types.SimpleNamespace(address=[]), log=None)
settings["on_starting"](server)
print(json.dumps({"cuda_calls": calls, "probes": len(probes), "workers": settings["workers"]}))
"""


def master_start(device: str) -> dict:
    env = {**os.environ, "DEVICE": device, "PORT": "0", "WEB_WORKERS": "1"}
    run = subprocess.run([sys.executable, "-c", MASTER_START], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_master_asks_for_cuda_in_a_child_and_initializes_nothing_itself():
    seen = master_start("cuda")
    assert seen["cuda_calls"] == []
    assert seen["probes"] == 1  # the check ran, in a child process


def test_device_auto_makes_the_master_ask_nothing_about_cuda():
    seen = master_start("auto")
    assert seen["probes"] == 0
    assert seen["cuda_calls"] == []


def test_device_auto_serves_on_the_gpu_when_the_worker_finds_one_and_on_the_cpu_otherwise(monkeypatch):
    import torch

    from model.corrector import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"


def test_device_cuda_without_a_usable_gpu_stops_the_start_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"cuda was asked for, but torch \S+ (is a CPU build|sees no usable CUDA)"):
        check_device(Config(device="cuda"))


def test_cpu_and_auto_are_never_refused_and_start_no_child():
    assert check_device(Config(device="cpu"), python="/nowhere/python") == 0
    assert check_device(Config(device="auto"), python="/nowhere/python") == 0
