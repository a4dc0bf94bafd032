"""How the service takes its settings: `python -m api` flags, gunicorn's settings, start-up errors, the app.

The `Config` class itself is tested in tests/test_config.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from api.__main__ import parse_config
from config import REPO_ROOT, ConfigError


def test_create_app_shares_answers_through_redis_when_redis_url_is_set(make_app, config):
    from api.state import EXTENSION_KEY
    from cache import RedisResultCache

    app = make_app(config=dataclasses.replace(config, redis_url="redis://localhost:6379/0"))
    assert isinstance(app.extensions[EXTENSION_KEY].cache.shared, RedisResultCache)  # connects lazily


def test_create_app_refuses_an_incomplete_weights_folder_before_building_anything(tmp_path):
    from api import create_app
    from config import Config

    with pytest.raises(ConfigError, match=r"^weights_dir: .* is incomplete: config.json, vocab.json, model"):
        create_app(Config(weights_dir=tmp_path))


def test_cli_flags_override_the_environment(tmp_path):
    weights = tmp_path / "w"
    weights.symlink_to(Path(__file__).resolve().parents[2] / "model" / "weights")
    env = {"PORT": "9000", "MAX_BATCH_SIZE": "8", "DEVICE": "auto"}
    flags = ["--port", "9001", "--max-batch-size", "16", "--weights-dir", str(weights), "--device", "cpu"]
    config = parse_config(flags, env)
    assert (config.port, config.max_batch_size, config.device) == (9001, 16, "cpu")
    assert config.weights_dir == weights


def test_cli_rejects_bad_flag_values():
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1, got 0"):
        parse_config(["--max-batch-size", "0"], {})


def test_gunicorn_conf_serves_a_gthread_worker_per_core_on_port_on_a_two_core_machine(monkeypatch):
    monkeypatch.delenv("HOST", raising=False)
    monkeypatch.delenv("WEB_WORKERS", raising=False)
    monkeypatch.setenv("SHARED_DIR", "")
    monkeypatch.setenv("PORT", "9123")
    monkeypatch.setenv("MAX_BATCH_SIZE", "32")
    monkeypatch.setattr("config.usable_cores", lambda: 2)
    settings = runpy.run_path(str(REPO_ROOT / "server" / "gunicorn_conf.py"))
    assert settings["bind"] == "0.0.0.0:9123"
    assert settings["workers"] == 2
    assert settings["worker_class"] == "server.worker.ReadingThreadWorker"  # gthread, stamping requests at accept
    assert settings["threads"] > 2 * 32  # the pool's cap (two batches) and threads for the probes
    assert settings["graceful_timeout"] > 0
    assert settings["preload_app"] is False
    settings["on_exit"](None)


def test_gunicorn_conf_runs_a_worker_per_core_sharing_a_folder_the_master_removes_at_exit(monkeypatch):
    monkeypatch.setenv("SHARED_DIR", "")
    monkeypatch.delenv("WEB_WORKERS", raising=False)
    monkeypatch.setattr("config.usable_cores", lambda: 16)
    monkeypatch.setattr("machine.available_memory", lambda: 64 << 30)
    settings = runpy.run_path(str(REPO_ROOT / "server" / "gunicorn_conf.py"))
    assert settings["workers"] == 16
    shared = Path(os.environ["SHARED_DIR"])
    assert shared.is_dir()
    settings["on_exit"](None)
    assert not shared.exists()
    monkeypatch.setenv("WEB_WORKERS", "3")
    assert runpy.run_path(str(REPO_ROOT / "server" / "gunicorn_conf.py"))["workers"] == 3


GUNICORN = Path(sys.executable).parent / "gunicorn"


@pytest.mark.parametrize("command", [
    [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", "api:create_app()"],  # make run
    [sys.executable, "-m", "api"],
], ids=["gunicorn", "python-m-api"])
@pytest.mark.parametrize(("env", "message"), [
    ({"MAX_BATCH_SIZE": "0"}, "max_batch_size must be >= 1, got 0"),
    ({"JUDGE_TIMEOUT_S": "soon"}, "judge_timeout_s must be a number, got 'soon'"),
    # Regression: these three printed a worker's traceback and "Worker failed to boot", or made /nonexistent/x.
    ({"REDIS_URL": "notaurl"}, "redis_url must be a redis://, rediss:// or unix:// URL (e.g. redis://host:6379/0), "
                               "got one with no scheme"),
    ({"SHARED_DIR": str(REPO_ROOT / "README.md")}, f"shared_dir must name a folder, got '{REPO_ROOT / 'README.md'}', "
                                                   "which is a file"),
    ({"SHARED_DIR": "/nonexistent/x"}, "shared_dir must name a folder or a new one in an existing folder, got "
                                       "'/nonexistent/x', whose parent '/nonexistent' does not exist"),
])
def test_server_start_says_a_bad_setting_in_one_line_and_exits_nonzero(command, env, message):
    """Regression: under gunicorn a bad setting printed 26 lines of traceback under "Failed to read config file"."""
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", **env}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    assert run.stdout == ""
    if command[0] == sys.executable:  # Flask's development server, run by hand
        assert run.stderr == f"config error: {message}\n"
    else:  # make run: every line on stderr is JSON
        assert run.stderr.count("\n") == 1
        line = json.loads(run.stderr)
        assert (line["level"], line["msg"]) == ("ERROR", f"config error: {message}")


def test_python_m_api_run_by_a_python_without_the_packages_says_what_to_run_in_one_line():
    """Regression: the README's `python -m api`, run by a system Python (no flask), ended in a traceback."""
    run = subprocess.run([sys.executable, "-S", "-m", "api"], cwd=REPO_ROOT, env={**os.environ, "PORT": "0"},
                         capture_output=True, text=True, timeout=60)  # -S: without the site-packages of .venv
    assert run.returncode == 2
    [line] = run.stderr.splitlines()
    assert line.startswith("python -m api needs ")
    assert line.endswith("run `make run` (or `.venv/bin/python -m api`) after `make install`")
    assert run.stdout == ""


def test_app_warns_when_captain_email_is_missing(make_app, config, caplog):
    import dataclasses
    import logging

    caplog.set_level(logging.WARNING, logger="api.app")
    make_app(config=dataclasses.replace(config, captain_email=""))
    assert any("CAPTAIN_EMAIL" in r.getMessage() for r in caplog.records)


def test_python_m_api_warns_of_a_misspelled_setting_and_closes_as_gunicorn_does(monkeypatch, capsys, config):
    """Issue 62: `python -m api` never closed the batcher, the cache writer or the watcher (only gunicorn's
    worker_exit did), and `MAX_BATCH_SIZ=8` was silently ignored."""
    from flask import Flask

    import api.app
    from api.__main__ import main
    from api.state import EXTENSION_KEY
    from tests.fakes import FakeCorrector

    built: list[Flask] = []
    create_app = api.app.create_app

    def fake_app(_config: object) -> Flask:
        built.append(create_app(config, corrector=FakeCorrector()))
        return built[0]

    monkeypatch.setattr(api.app, "create_app", fake_app)
    monkeypatch.setattr(Flask, "run", lambda *args, **kwargs: None)  # serves nothing: main goes on to its close
    monkeypatch.setenv("MAX_BATCH_SIZ", "8")

    assert main([]) == 0

    assert capsys.readouterr().err.count("warning: MAX_BATCH_SIZ is not a setting (ignored)") == 1
    state = built[0].extensions[EXTENSION_KEY]
    assert not state.engine.alive()  # closed by AppState.closing, as worker_exit closes it
