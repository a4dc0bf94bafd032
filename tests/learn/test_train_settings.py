"""`learn.train_settings.TrainSettings`: the command line and `learn.adapt` build the same typed settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from learn.fit import run_id
from learn.train_settings import DEFAULT_LR, TrainSettings, parse_args


def test_the_command_line_and_a_direct_construction_give_equal_settings_and_the_same_checkpoint_name():
    flags = parse_args(["--init", "shipped", "--sim-ratio", "0", "--steps", "5", "--warmup", "1", "--lr", "0.0002",
                        "--batch-size", "8", "--ckpt-dir", "ckpt", "--seed", "3", "--max-minutes", "2.5"])
    direct = TrainSettings(init="shipped", sim_ratio=0.0, steps=5, warmup=1, lr=2e-4, batch_size=8,
                           ckpt_dir=Path("ckpt"), seed=3, max_minutes=2.5)
    assert flags == direct
    assert run_id(flags) == run_id(direct) is not None


def test_init_and_learning_rate_default_by_whether_labelled_data_is_given():
    assert (TrainSettings().init, TrainSettings().lr) == ("scratch", DEFAULT_LR["scratch"])
    labelled = parse_args(["--data", "x.jsonl", "--data", "y.jsonl"])
    assert (labelled.init, labelled.lr, labelled.data) == ("shipped", DEFAULT_LR["shipped"],
                                                           (Path("x.jsonl"), Path("y.jsonl")))


def test_an_out_of_range_setting_stops_the_command_line_in_one_line(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--dev-share", "1.5"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("dev_share must be in [0, 1), got 1.5")
    with pytest.raises(ValueError, match="sim_ratio must be >= 0"):
        TrainSettings(sim_ratio=-1)
