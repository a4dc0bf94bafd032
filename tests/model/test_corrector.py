"""The shipped corrector, end to end on the real samples (uses the committed weights)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from config import DEFAULT_WEIGHTS_DIR
from model.contract import sha256
from model.corrector import Corrector, choose
from model.features import Featurizer, Vocab
from preprocess.text import NBest, is_han

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def corrector() -> Corrector:
    c = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu")
    c.setup()
    return c


def _samples(rows: list[dict]) -> list[NBest]:
    return [NBest(tuple(r["sentence_list"]), tuple(r.get("phoneme_sequence_list") or ())) for r in rows]


def test_corrector_ships_small_weights_with_vocab_and_config():
    files = {p.name: p.stat().st_size for p in DEFAULT_WEIGHTS_DIR.iterdir()}
    assert {"model.safetensors", "vocab.json", "config.json"} <= set(files)
    assert sum(files.values()) <= 30 * 1024 * 1024


def test_corrector_setup_loads_and_warms_up(corrector):
    assert corrector.ready
    assert corrector.info["parameters"] > 1_000_000
    assert 0.0 < corrector.info["threshold"] <= 1.01


def test_on_cpu_the_network_runs_in_int8_by_default_and_answers_as_in_fp32(corrector, real_requests):
    fp32 = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu", cpu_precision="fp32")
    fp32.setup()
    assert (corrector.info["precision"], fp32.info["precision"]) == ("int8", "fp32")
    assert corrector.info["parameters"] == fp32.info["parameters"]  # the same network, stored smaller
    items = _samples(real_requests) + corrector._warm_up_lists()  # 5 real lists, 256 of frequent Taiwan words
    same = sum(a == b for a, b in zip(corrector.predict_batch(items), fp32.predict_batch(items), strict=True))
    assert same >= 0.98 * len(items)  # int8 moves only rare close calls (model/corrector.py's docstring)


def test_corrector_answers_every_real_request_with_chinese_characters(corrector, real_requests):
    items = _samples(real_requests)
    answers = corrector.predict_batch(items)
    assert len(answers) == len(items)
    for item, answer in zip(items, answers, strict=True):
        assert answer and " " not in answer
        assert all(is_han(c) for c in answer)
        # a correction stays close to TOP1: the n-best only offers local changes
        assert abs(len(answer) - len(item.top1.replace(" ", ""))) <= 3


def test_corrector_answers_the_same_alone_and_in_a_batch(corrector, real_requests):
    items = _samples(real_requests)
    batched = corrector.predict_batch(items)
    assert [corrector.predict_batch([it])[0] for it in items] == batched


def test_corrector_keeps_an_unambiguous_top1(corrector):
    nb = NBest(("我們 今天 去 學校",) * 10)
    assert corrector.predict_batch([nb]) == ["我們今天去學校"]


def test_corrector_falls_back_to_top1_without_chinese(corrector):
    assert corrector.predict_batch([NBest(("while e-mail",))]) == ["whilee-mail"]


def test_the_network_alone_keeps_top1_where_it_would_delete_every_character():
    """A hypothesis with no Han character offers a deletion at every position of TOP1; taken everywhere, it would
    leave an empty answer: TOP1 is kept instead, so the corrector never answers empty."""
    example = Featurizer(Vocab.load(DEFAULT_WEIGHTS_DIR / "vocab.json")).featurize(NBest(("的 的", "<htr>")))
    assert [cands[1] for cands in example.candidates] == ["", ""]
    deletion_everywhere = np.array([[0.0, 1.0]] * 2)
    assert choose(example, deletion_everywhere, threshold=0.5) == "的的"
    one_deletion = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert choose(example, one_deletion, threshold=0.5) == "的"


def test_corrector_keeps_a_spoken_filler_that_top1_and_most_hypotheses_hold(corrector):
    """Regression: the network, trained on a simulator that only inserted fillers, deleted the ones said."""
    item = NBest(("欸 我 想 問 一下 信用卡 帳單", "我 想 問 一下 信用卡 帳單", "欸 我 想 問 一下 信用卡 賬單",
                  "欸 我 想 問 一 下 信用卡 帳單"))
    assert corrector.predict_batch([item])[0].startswith("欸")


def test_corrector_never_answers_a_variant_form_of_top1(corrector):
    item = NBest(("台灣 的 捷運 站 在 哪裡", "臺灣 的 捷運 站 在 哪裏", "臺灣 的 捷運 站 在 哪裡"))
    assert corrector.predict_batch([item])[0] == "台灣的捷運站在哪裡"


def test_corrector_answers_with_the_stage_it_was_asked_for():
    items = [NBest(("今天 故價 上漲", "今天 股價 上漲", "今天 股價 上漲"))]
    for stage in ("net", "lm", "full"):
        c = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu", stage=stage, lm_path=None if stage == "net" else
                      Corrector(DEFAULT_WEIGHTS_DIR).lm_path)
        c.setup()
        assert (c.reranker is None) == (stage == "net")
        assert c.predict_batch(items)[0]


def test_corrector_setup_reuses_what_preload_read_before_a_fork():
    """gunicorn's master reads the vocabulary, its confusion set and the Taiwan lexicon once (api.preload); every
    worker's loading thread then skips that Python (0.34 s idle, more under load)."""
    from model.corrector import _SHARED, preload

    preload(DEFAULT_WEIGHTS_DIR)
    key = sha256(DEFAULT_WEIGHTS_DIR / "vocab.json")  # the vocabulary's, wherever its file lies
    c = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu")
    c.setup()
    assert c.vocab is _SHARED[("vocab", key)]
    assert c.featurizer.confusion is _SHARED[("confusion", key)]
    assert c.lm is not None and c.lm.lexicon is next(v for (kind, _), v in _SHARED.items() if kind == "lexicon")



def test_on_cpu_the_traced_network_gives_the_eager_networks_probabilities_to_the_bit(real_requests, monkeypatch):
    """Guards issue 21's TorchScript trace (`CPU_RUNTIME=torch`): the same kernels, so the same logits, padded or
    not."""
    import torch

    corrector = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu", cpu_runtime="torch")
    corrector.setup()
    monkeypatch.setattr("model.corrector.traced", lambda net, example: net)
    eager = Corrector(DEFAULT_WEIGHTS_DIR, device="cpu", cpu_runtime="torch")
    eager.setup()
    assert isinstance(corrector.net, torch.jit.ScriptModule)
    assert not isinstance(eager.net, torch.jit.ScriptModule)
    items = _samples(real_requests) + corrector._warm_up_lists()[:59]
    for size in (1, len(items)):
        with torch.inference_mode():
            for _, tensors in corrector.batch(items[:size]).groups:
                assert torch.equal(corrector.net(**tensors), eager.net(**tensors))


def test_loading_the_model_prints_nothing_on_stderr():
    """Every stderr line of the service is JSON: a load must not print a library's plain-text warning (transformers'
    "loss_type=None was set in the config" came with every load). A fresh process: the warning is logged once."""
    code = "from model.corrector import Corrector; Corrector(device='cpu').setup()"
    run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == ""
