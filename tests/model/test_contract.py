"""model.contract: the feature columns the weights were trained on must be the ones the code computes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import DEFAULT_WEIGHTS_DIR, REPO_ROOT, Config, ConfigError
from model.contract import (
    CANDIDATE_FEATURES,
    FeatureContractError,
    check_features,
    check_weights,
    check_weights_dir,
    feature_columns,
)
from model.corrector import Corrector
from model.features import N_CAND_FEATS
from model.weights_meta import WeightsMeta


def _weights_with(tmp_path: Path, features: dict | None) -> Path:
    """Copy the shipped weights folder, with `features` (None: none recorded) in its config."""
    out = tmp_path / "weights"
    shutil.copytree(DEFAULT_WEIGHTS_DIR, out)
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    meta.pop("features")
    if features is not None:
        meta["features"] = features
    (out / "config.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    return out


def _feature_record() -> dict:
    return feature_columns().to_dict()


def _reordered() -> dict:
    record = _feature_record()
    record["candidate"] = record["candidate"][1:] + record["candidate"][:1]
    return record


def test_contract_names_every_column_the_featurizer_fills():
    assert len(CANDIDATE_FEATURES) == N_CAND_FEATS
    check_weights_dir(DEFAULT_WEIGHTS_DIR)  # the shipped weights agree with the code


@pytest.mark.parametrize(("features", "message"), [
    (_reordered(), "same names in another order"),
    (_feature_record() | {"candidate": [*CANDIDATE_FEATURES, "acoustic"]}, "unknown ['acoustic']"),
    (_feature_record() | {"position": ["agreement"]}, "missing ['alternatives'"),
    (_feature_record() | {"scales": {"log_freq": 8.0}}, "feature scales"),
])
def test_check_features_names_what_differs(features, message):
    meta = WeightsMeta.load(DEFAULT_WEIGHTS_DIR).to_dict() | {"features": features}
    with pytest.raises(FeatureContractError, match=message.replace("[", r"\[").replace("(", r"\(")):
        check_features(WeightsMeta.from_dict(meta).features)


def test_check_weights_dir_refuses_weights_that_record_no_feature_columns(tmp_path):
    with pytest.raises(FeatureContractError, match="config.json: features is missing"):
        check_weights_dir(_weights_with(tmp_path, None))


@pytest.mark.real_model
def test_corrector_setup_refuses_weights_trained_on_other_features(tmp_path):
    with pytest.raises(FeatureContractError, match="another order"):
        Corrector(_weights_with(tmp_path, _reordered()), device="cpu", lm_path=None, stage="net").setup()


def test_the_start_up_check_refuses_weights_trained_on_other_features(tmp_path):
    with pytest.raises(ConfigError, match="weights_dir: the weights in .* another order"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(_weights_with(tmp_path, _reordered()))}))


@pytest.mark.parametrize("command", [
    [str(Path(sys.executable).parent / "gunicorn"), "-c", "server/gunicorn_conf.py", "api:create_app()"],
    [sys.executable, "-m", "api"],
], ids=["gunicorn", "python-m-api"])
def test_server_start_stops_in_one_line_on_weights_of_other_features(tmp_path, command):
    weights = _weights_with(tmp_path, _reordered())
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", "WEIGHTS_DIR": str(weights)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    message = run.stderr if command[0] == sys.executable else json.loads(run.stderr)["msg"]  # make run: JSON
    assert run.stderr.count("\n") == 1 and message.startswith("config error: weights_dir: ")



def _cut_short(tmp_path: Path, keep: int) -> Path:
    out = tmp_path / "cut"
    shutil.copytree(DEFAULT_WEIGHTS_DIR, out)
    network = out / "model.safetensors"
    network.write_bytes(network.read_bytes()[:keep])
    return out


@pytest.mark.parametrize("keep", [4, 1000, 10_000_000], ids=["no-header", "header-cut", "tensors-cut"])
def test_a_network_file_cut_short_is_refused_before_anything_loads_it(tmp_path, keep):
    with pytest.raises(FeatureContractError, match="cut short") as caught:
        check_weights_dir(_cut_short(tmp_path, keep))
    assert "model.safetensors" in str(caught.value) and "\n" not in str(caught.value)


def test_server_start_stops_in_one_line_on_a_network_file_cut_short(tmp_path):
    weights = _cut_short(tmp_path, 10_000_000)
    command = [str(Path(sys.executable).parent / "gunicorn"), "-c", "server/gunicorn_conf.py", "api:create_app()"]
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", "WEIGHTS_DIR": str(weights)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert json.loads(run.stderr)["msg"].startswith(f"config error: weights_dir: {weights / 'model.safetensors'}")
