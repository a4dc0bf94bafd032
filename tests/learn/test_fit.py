"""learn.fit: fine-tuning the network is reproducible: the same data and settings give the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from config import DEFAULT_WEIGHTS_DIR
from learn.data.labelled import Labelled
from learn.fit import fit, learning_rate
from learn.train import shipped_start
from learn.train_data import labelled_examples
from learn.train_settings import TrainSettings
from model.features import Featurizer
from model.network import CorrectorNet
from preprocess.text import NBest

pytestmark = pytest.mark.real_model

PAIRS = [("我想查詢信用卡帳單", "我 想 查尋 信用卡 帳單"), ("請幫我轉接客服", "請 幫 我 轉接 課服"),
         ("我要辦理掛失", "我 要 辦裡 掛失"), ("今天的匯率是多少", "今天 的 會率 是 多少")]


def test_fine_tuning_twice_gives_the_same_network_whatever_torchs_generator_held_before(tmp_path: Path):
    start = shipped_start(DEFAULT_WEIGHTS_DIR)
    items = [Labelled(f"r{k}", truth, NBest((top1,))) for k, (truth, top1) in enumerate(PAIRS)]
    examples, _, _ = labelled_examples(Featurizer(start.vocab), items)
    states = []
    for run in ("a", "b"):
        torch.rand(run == "a" and 3 or 5)  # whatever ran before in the process moved the generator differently
        net = CorrectorNet(start.net_cfg)
        net.load_state_dict(start.state)
        settings = TrainSettings(init="shipped", init_from=DEFAULT_WEIGHTS_DIR, sim_ratio=0.0, steps=3, warmup=1,
                                 lr=1e-3, batch_size=2, ckpt_dir=tmp_path / run, seed=5)
        assert fit(net, examples, settings, torch.device("cpu")) == 3
        states.append(net.state_dict())
    assert any(not torch.equal(states[0][k], start.state[k]) for k in start.state)  # it did train
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_the_learning_rate_ignores_the_clock_inside_the_time_limit_and_anneals_a_run_the_limit_will_cut(tmp_path):
    settings = TrainSettings(init="shipped", init_from=DEFAULT_WEIGHTS_DIR, sim_ratio=0.0, steps=100, warmup=10,
                             lr=1e-3, batch_size=2, ckpt_dir=tmp_path, seed=5, max_minutes=1.0)
    assert learning_rate(settings, 0, 100, 0.0) == 1e-4  # warm-up
    # well inside 60 s (0.5 s a step, 50 s in all): the same rate whatever the clock says
    assert learning_rate(settings, 55, 100, 20.0) == learning_rate(settings, 55, 100, 27.0) == 5e-4
    # on course to take 100 s: the decay runs over the minute, and the rate is 0 once it is spent
    assert learning_rate(settings, 30, 100, 30.0) < learning_rate(settings, 30, 100, 0.0)
    assert learning_rate(settings, 40, 100, 60.0) == 0.0
