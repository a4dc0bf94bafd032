"""config.Config: defaults, reading the environment, validation messages, immutability, the summary.

How the server takes these settings at start (flags, gunicorn, one-line errors) is in tests/api/test_app_settings.py.
"""

from __future__ import annotations

import dataclasses

import pytest

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


def test_config_from_env_reads_upper_case_field_names(tmp_path):
    weights = tmp_path / "w"
    weights.symlink_to(REPO_ROOT / "model" / "weights")
    config = Config.from_env({
        "PORT": "9000", "MAX_BATCH_SIZE": "16", "MAX_BATCH_WAIT_S": "0.05", "JUDGE_TIMEOUT_S": "2",
        "DEVICE": "CPU", "LOG_LEVEL": "debug", "WEIGHTS_DIR": str(weights), "CAPTAIN_EMAIL": "a@b.c",
        "CPU_RUNTIME": "ONNX",
        "UNRELATED": "ignored",
    })
    assert (config.port, config.max_batch_size, config.max_batch_wait_s) == (9000, 16, 0.05)
    assert config.budget_s == pytest.approx(1.75)
    assert (config.device, config.log_level, config.cpu_runtime) == ("cpu", "DEBUG", "onnx")
    assert config.weights_dir == weights
    assert config.captain_email == "a@b.c"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WEIGHTS_POLL_S": "-1"}, "weights_poll_s must be >= 0, got -1.0"),
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
        ({"HTTP_THREADS": "64"}, "http_threads must be 0 (automatic) or >= 2 * max_batch_size (128), got 64"),
        ({"HTTP_THREADS": "-1"}, "http_threads must be >= 0, got -1"),
        ({"POOL_LIMIT": "64"}, "POOL_LIMIT was removed: the thread pool holds two batches' worth of requests"),
        ({"MAX_TOP1_CHARS": "300"}, "max_top1_chars must be <= max_chars_per_hypothesis (200), got 300"),
        ({"CACHE_TTL_S": "-5"}, "cache_ttl_s must be > 0, got -5.0"),
        ({"BATCHER_WORKERS": "0"}, "batcher_workers must be >= 1, got 0"),
        ({"CUDA_DEVICES": "0,,1"}, "cuda_devices must be comma-separated device ids like '0,1', got '0,,1'"),
        ({"LM_PATH": "/nowhere/zh.lm"}, "lm_path must name an existing KenLM file, got '/nowhere/zh.lm'"),
        ({"STAGE": "oracle"}, "stage must be one of full, lm, net, got 'oracle'"),
        ({"CPU_PRECISION": "fp16"}, "cpu_precision must be one of int8, fp32, got 'fp16'"),
        ({"CPU_RUNTIME": "tvm"}, "cpu_runtime must be one of torch, onnx, got 'tvm'"),
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


def test_config_needs_no_lm_file_for_the_network_alone():
    config = Config.from_env({"STAGE": "NET", "LM_PATH": "/nowhere/zh.lm"})
    assert config.stage == "net"


def test_a_weights_dir_that_does_not_exist_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="weights_dir must name an existing weights folder, got '.*nowhere'"):
        Config.from_env({"WEIGHTS_DIR": str(tmp_path / "nowhere")})


def test_a_weights_dir_link_that_dangles_is_refused_saying_where_it_leads(tmp_path):
    """Issue 62: `ln -sfn model/weights adapted/current` dangles (a relative target is read from adapted/); the
    refusal said neither that it is a link nor where it leads."""
    (tmp_path / "adapted").mkdir()
    (tmp_path / "adapted" / "current").symlink_to("model/weights")

    with pytest.raises(ConfigError) as refused:
        Config.from_env({"WEIGHTS_DIR": str(tmp_path / "adapted" / "current")})

    assert "a symlink to 'model/weights'" in str(refused.value)
    assert f"which leads to {str(tmp_path / 'adapted' / 'model' / 'weights')!r}" in str(refused.value)


@pytest.mark.parametrize(("var", "setting"), [("MAX_BATCH_SIZ", "MAX_BATCH_SIZE"), ("WEB_WORKRES", "WEB_WORKERS"),
                                              ("PROT", "PORT"), ("MAX_BATCH_SIZEE", "MAX_BATCH_SIZE")])
def test_an_environment_variable_one_edit_from_a_setting_gets_one_warning_line(var, setting):
    """Issue 62: `MAX_BATCH_SIZ=8` was silently ignored."""
    assert Config.misspelled({var: "8", "MAX_BATCH_SIZE": "8", "PATH": "/bin", "HOME": "/root"}) == [
        f"{var} is not a setting (ignored): did you mean {setting}?"]


def test_settings_and_unrelated_environment_variables_get_no_warning():
    assert Config.misspelled({"MAX_BATCH_SIZE": "8", "PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8",
                              "HOSTNAME": "box", "PYTHONPATH": "."}) == []


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://:pw@cache.example:6380/1",
                                 "unix:///run/redis.sock?db=0"])
def test_a_redis_url_redis_can_read_is_taken(url):
    assert Config.from_env({"REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize(("url", "message"), [
    ("notaurl", "redis_url must be a redis://, rediss:// or unix:// URL .*, got one with no scheme"),
    ("http://s3cret@cache:6379", "redis_url must be a redis://, .*, got one with scheme 'http'"),
    ("redis://:s3cret@cache:port", "redis_url is not a URL redis can read"),
])
def test_a_redis_url_redis_cannot_read_is_one_clear_error_that_never_shows_the_url(url, message):
    with pytest.raises(ConfigError, match=message) as raised:
        Config.from_env({"REDIS_URL": url})
    assert "s3cret" not in str(raised.value) and "notaurl" not in str(raised.value)


def test_a_shared_dir_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="shared_dir must name a folder, got '.*file', which is a file"):
        Config.from_env({"SHARED_DIR": str(tmp_path / "file")})


def test_a_shared_dir_is_made_only_inside_an_existing_folder(tmp_path):
    assert Config.from_env({"SHARED_DIR": str(tmp_path / "new")}).shared_dir == str(tmp_path / "new")
    with pytest.raises(ConfigError, match="shared_dir must name a folder or a new one in an existing folder, got "
                                          "'.*nowhere/x', whose parent '.*nowhere' does not exist"):
        Config.from_env({"SHARED_DIR": str(tmp_path / "nowhere" / "x")})


def test_workers_default_to_one_per_usable_core_and_a_cgroup_cpu_limit_narrows_the_cores(tmp_path, monkeypatch):
    from config import usable_cores

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    limit = tmp_path / "cpu.max"
    assert usable_cores(tmp_path / "none") == 16
    limit.write_text("max 100000\n")
    assert usable_cores(limit) == 16
    limit.write_text("250000 100000\n")  # a limit of 2.5 CPUs
    assert usable_cores(limit) == 3
    monkeypatch.setattr("config.usable_cores", lambda: 16)
    assert Config().workers == 16 and Config().threads_per_worker == 1
    assert Config(web_workers=3).workers == 3 and Config(web_workers=3).threads_per_worker == 5
    assert Config(web_workers=3, torch_threads=1).threads_per_worker == 1
    monkeypatch.setattr("config.usable_cores", lambda: 1)
    assert Config().workers == 1


def test_the_pool_holds_the_running_batch_and_the_next_one_with_spare_threads_for_the_probes():
    from config import SPARE_THREADS

    assert Config().pool_cap == 128 and Config().threads == 128 + SPARE_THREADS
    assert Config(max_batch_size=8).pool_cap == 16 and Config(max_batch_size=8).threads == 16 + SPARE_THREADS
    assert Config(max_batch_size=8, http_threads=16).threads == 16
