"""A team's masked LM in the served corrector (`MLM_DIR`): loaded where the served stage weighs it, refused in one
line without the model it was fitted with, ignored with one warning by a folder fitted without one (the shipped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import DEFAULT_WEIGHTS_DIR, Config, ConfigError
from model.contract import check_weights, ignored_masked_lm
from model.corrector import Corrector
from model.masked_lm import MaskedLMError
from preprocess.text import NBest
from tests.model.tiny_mlm import tiny_masked_lm, weighing_folder

pytestmark = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTS = [NBest(("可能 導致 不是 泡沫 再現", "可能 導致 股市 泡沫 再現", "可能 導致 古是 泡沫 再現")),
         NBest(("車 是 已 逐漸 回溫", "車 市 已 逐漸 回溫", "車 是 以 逐漸 回溫")),
         NBest(("今天 故價 上漲", "今天 股價 上漲")), NBest(("我 想 查詢 信用卡 帳單",))]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("masked")
    mlm = tiny_masked_lm(root / "tiny")
    return {"mlm": mlm, "other": tiny_masked_lm(root / "other", seed=1),
            "weighing": weighing_folder(root / "adapted", mlm, weight=1.0)}


def _setup(folder: Path, mlm: Path | None) -> Corrector:
    corrector = Corrector(folder, device="cpu", cpu_precision="fp32", masked_lm_dir=mlm)
    corrector.setup()
    return corrector


def test_the_shipped_folder_fitted_without_a_masked_lm_ignores_one_and_answers_as_without(made):
    plain, given = _setup(DEFAULT_WEIGHTS_DIR, None), _setup(DEFAULT_WEIGHTS_DIR, made["mlm"])
    assert given.masked_lm is None and given.info["masked_lm"] is None
    assert given.predict_batch(LISTS) == plain.predict_batch(LISTS)


def test_a_folder_that_weighs_a_masked_lm_loads_it_and_its_answers_follow_the_weight(made):
    corrector = _setup(made["weighing"], made["mlm"])
    assert corrector.info["masked_lm"]["path"] == str(made["mlm"])
    answers = corrector.predict_batch(LISTS)
    assert len(answers) == len(LISTS) and all(answers)
    # the batch's lists are asked together: each answer is the one it gets alone
    assert answers == [corrector.predict_batch([nb])[0] for nb in LISTS]
    # a heavy weight: the masked LM's preference decides among the candidates past the margin
    heavy = _setup(weighing_folder(made["weighing"].parent / "heavy", made["mlm"], weight=1e6), made["mlm"])
    reranker = heavy.reranker
    assert reranker is not None
    batch = heavy.batch(LISTS[:3])
    probs = heavy.predict(batch)
    for k, example in enumerate(batch.examples):
        cands = reranker.candidates(example, probs[k])
        [gains] = reranker.mlm_gains([example], [cands])
        best = max(range(1, len(cands)), key=lambda j: gains[j])
        expected = cands[best].text if gains[best] > 1e-3 else example.top1
        if reranker._only_variants(example.top1, cands[best]):
            continue
        assert heavy.predict_batch([LISTS[k]])[0] == expected


@pytest.mark.parametrize("given, words", [(None, "set MLM_DIR to that folder"), ("other", "holds another")])
def test_a_folder_fitted_with_a_masked_lm_is_refused_without_it_in_one_line(made, given, words):
    with pytest.raises(MaskedLMError) as caught:
        _setup(made["weighing"], made[given] if given else None)
    assert words in str(caught.value) and str(made["mlm"]) in str(caught.value) and "\n" not in str(caught.value)


def test_the_start_up_check_refuses_the_wrong_masked_lm_and_warns_of_an_ignored_one(made):
    ok = Config.from_env({"WEIGHTS_DIR": str(made["weighing"]), "MLM_DIR": str(made["mlm"])})
    assert ignored_masked_lm(ok, check_weights(ok)) is None
    for env in ({"WEIGHTS_DIR": str(made["weighing"])},
                {"WEIGHTS_DIR": str(made["weighing"]), "MLM_DIR": str(made["other"])}):
        with pytest.raises(ConfigError, match="^mlm_dir: .* was fitted with the masked LM at"):
            check_weights(Config.from_env(env))
    shipped = Config.from_env({"MLM_DIR": str(made["mlm"])})
    assert "is ignored: the 'full' stage of" in ignored_masked_lm(shipped, check_weights(shipped))


def test_an_mlm_dir_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match="mlm_dir must name an existing masked-LM folder, got '/nonexistent'"):
        Config.from_env({"MLM_DIR": "/nonexistent"})


@pytest.mark.parametrize("command", [
    [str(Path(sys.executable).parent / "gunicorn"), "-c", "server/gunicorn_conf.py", "api:create_app()"],
    [sys.executable, "-m", "api"],
], ids=["gunicorn", "python-m-api"])
@pytest.mark.parametrize("case", ["nonexistent", "without-it"])
def test_server_start_stops_in_one_line_without_the_masked_lm_it_needs(made, command, case):
    env = {"MLM_DIR": "/nonexistent"} if case == "nonexistent" else {"WEIGHTS_DIR": str(made["weighing"])}
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", **env}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    message = run.stderr if command[0] == sys.executable else json.loads(run.stderr)["msg"]  # make run: JSON
    assert run.stderr.count("\n") == 1 and message.startswith("config error: mlm_dir")
