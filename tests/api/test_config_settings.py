"""config.Config, the `python -m api` command line and the gunicorn settings built from it."""

from __future__ import annotations

import dataclasses
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from api.__main__ import parse_config
from config import REPO_ROOT, Config, ConfigError


def test_config_defaults_follow_the_contract():
    config = Config()
    assert config.port == 8080
    assert config.judge_timeout_s == 1.0
    assert config.budget_s == pytest.approx(0.75)
    assert config.max_top1_chars == 45
    assert config.max_hypotheses == 10
    assert config.weights_dir == REPO_ROOT / "model" / "weights"
    assert config.redis_url == ""


def test_config_from_env_reads_upper_case_field_names():
    config = Config.from_env({
        "PORT": "9000", "MAX_BATCH_SIZE": "16", "MAX_BATCH_WAIT_S": "0.05", "JUDGE_TIMEOUT_S": "2",
        "DEVICE": "CPU", "LOG_LEVEL": "debug", "WEIGHTS_DIR": "/tmp/w", "CAPTAIN_EMAIL": "a@b.c",
        "UNRELATED": "ignored",
    })
    assert (config.port, config.max_batch_size, config.max_batch_wait_s) == (9000, 16, 0.05)
    assert config.budget_s == pytest.approx(1.75)
    assert (config.device, config.log_level) == ("cpu", "DEBUG")
    assert config.weights_dir == Path("/tmp/w")
    assert config.captain_email == "a@b.c"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAX_BATCH_SIZE": "0"}, "max_batch_size must be >= 1, got 0"),
        ({"PORT": "eighty"}, "port must be an integer, got 'eighty'"),
        ({"PORT": "70000"}, "port must be <= 65535, got 70000"),
        ({"JUDGE_TIMEOUT_S": "nan"}, "judge_timeout_s must be a number, got 'nan'"),
        ({"JUDGE_TIMEOUT_S": "0"}, "judge_timeout_s must be > 0, got 0.0"),
        ({"SAFETY_MARGIN_S": "1.0"}, "budget_s (judge_timeout_s - safety_margin_s) must be > 0"),
        ({"MAX_BATCH_WAIT_S": "0.8"}, "max_batch_wait_s must be < budget_s (0.75), got 0.8"),
        ({"MAX_BATCH_WAIT_S": "-1"}, "max_batch_wait_s must be >= 0, got -1.0"),
        ({"BATCH_POLICY": "greedy"}, "batch_policy must be one of adaptive, fixed, got 'greedy'"),
        ({"DEVICE": "tpu"}, "device must be one of auto, cpu, cuda, got 'tpu'"),
        ({"LOG_LEVEL": "loud"}, "log_level must be one of"),
        ({"HTTP_THREADS": "64"}, "http_threads must be >= 2 * max_batch_size (128), got 64"),
        ({"MAX_TOP1_CHARS": "300"}, "max_top1_chars must be <= max_chars_per_hypothesis (200), got 300"),
        ({"CACHE_TTL_S": "-5"}, "cache_ttl_s must be > 0, got -5.0"),
        ({"BATCHER_WORKERS": "0"}, "batcher_workers must be >= 1, got 0"),
        ({"CUDA_DEVICES": "0,,1"}, "cuda_devices must be comma-separated device ids like '0,1', got '0,,1'"),
        ({"LM_PATH": "/nowhere/zh.lm"}, "lm_path must name an existing KenLM file, got '/nowhere/zh.lm'"),
        ({"STAGE": "oracle"}, "stage must be one of full, lm, net, got 'oracle'"),
    ],
)
def test_config_rejects_bad_settings_naming_them(env, message):
    with pytest.raises(ConfigError) as excinfo:
        Config.from_env(env)
    assert message in str(excinfo.value)


def test_config_is_frozen_and_validated_on_replace():
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="max_hypotheses must be >= 1, got 0"):
        dataclasses.replace(config, max_hypotheses=0)


def test_config_summary_hides_secrets():
    summary = Config(server_uuid_salt="s3cret", redis_url="redis://:pw@host").summary()
    assert summary["server_uuid_salt"] == "<set>"
    assert summary["redis_url"] == "<set>"
    assert "s3cret" not in str(summary)


def test_create_app_shares_answers_through_redis_when_redis_url_is_set(make_app, config):
    from api.state import EXTENSION_KEY
    from cache import RedisResultCache

    app = make_app(config=dataclasses.replace(config, redis_url="redis://localhost:6379/0"))
    assert isinstance(app.extensions[EXTENSION_KEY].cache.shared, RedisResultCache)  # connects lazily


def test_cli_flags_override_the_environment():
    env = {"PORT": "9000", "MAX_BATCH_SIZE": "8", "DEVICE": "cuda"}
    config = parse_config(["--port", "9001", "--max-batch-size", "16", "--weights-dir", "/tmp/w"], env)
    assert (config.port, config.max_batch_size, config.device) == (9001, 16, "cuda")
    assert config.weights_dir == Path("/tmp/w")


def test_cli_rejects_bad_flag_values():
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1, got 0"):
        parse_config(["--max-batch-size", "0"], {})


def test_gunicorn_conf_serves_one_gthread_worker_on_port(monkeypatch):
    monkeypatch.delenv("HOST", raising=False)
    monkeypatch.setenv("PORT", "9123")
    monkeypatch.setenv("MAX_BATCH_SIZE", "32")
    settings = runpy.run_path(str(REPO_ROOT / "api" / "gunicorn_conf.py"))
    assert settings["bind"] == "0.0.0.0:9123"
    assert settings["workers"] == 1
    assert settings["worker_class"] == "api.worker.StampingThreadWorker"  # gthread, stamping requests at accept
    assert settings["threads"] >= 2 * 32
    assert settings["graceful_timeout"] > 0
    assert settings["preload_app"] is False


GUNICORN = Path(sys.executable).parent / "gunicorn"


@pytest.mark.parametrize("command", [
    [str(GUNICORN), "-c", "api/gunicorn_conf.py", "--no-control-socket", "api:create_app()"],  # make run
    [sys.executable, "-m", "api"],
], ids=["gunicorn", "python-m-api"])
@pytest.mark.parametrize(("env", "message"), [
    ({"MAX_BATCH_SIZE": "0"}, "max_batch_size must be >= 1, got 0"),
    ({"JUDGE_TIMEOUT_S": "soon"}, "judge_timeout_s must be a number, got 'soon'"),
])
def test_server_start_says_a_bad_setting_in_one_line_and_exits_nonzero(command, env, message):
    """Regression: under gunicorn a bad setting printed 26 lines of traceback under "Failed to read config file"."""
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", **env}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr == f"config error: {message}\n"
    assert run.stdout == ""


def test_app_warns_when_captain_email_is_missing(make_app, config, caplog):
    import dataclasses
    import logging

    caplog.set_level(logging.WARNING, logger="api.app")
    make_app(config=dataclasses.replace(config, captain_email=""))
    assert any("CAPTAIN_EMAIL" in r.getMessage() for r in caplog.records)


def test_config_needs_no_lm_file_for_the_network_alone():
    config = Config.from_env({"STAGE": "NET", "LM_PATH": "/nowhere/zh.lm"})
    assert config.stage == "net"
