"""model.masked_lm: a Hugging Face masked-LM folder checked, loaded from the folder alone, and asked for each
candidate's gain over TOP1 (a random tiny BERT made here: tests/model/tiny_mlm.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from model.masked_lm import MaskedLM, MaskedLMError, check_folder, spans
from tests.model.tiny_mlm import tiny_masked_lm

TOP1 = "可能導致不是泡沫再現"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_masked_lm(tmp_path_factory.mktemp("mlm") / "tiny")


@pytest.fixture(scope="module")
def mlm(folder) -> MaskedLM:
    """In fp32, so that a gain is the reference's to the last digits whatever the batch."""
    return MaskedLM(folder, "cpu", cpu_precision="fp32")


def _log_p(mlm: MaskedLM, left: str, chars: str, right: str) -> float:
    """The reference: `chars` masked between `left` and `right`, their log-probabilities summed, by hand."""
    ids = [*mlm.prefix, *map(mlm._id, left), *[mlm.mask_id] * len(chars), *map(mlm._id, right), *mlm.suffix]
    with torch.inference_mode():
        logits = mlm.model(input_ids=torch.tensor([ids])).logits[0]
    at = len(mlm.prefix) + len(left)
    logp = torch.log_softmax(logits[at : at + len(chars)].float(), dim=-1)
    return float(sum(logp[k, mlm._id(c)] for k, c in enumerate(chars)))


def _choice(top1: str, **changes: str) -> tuple[str, ...]:
    segs = list(top1)
    for position, seg in changes.items():
        segs[int(position[1:])] = seg
    return tuple(segs)


def test_a_substitutions_gain_is_its_characters_log_probability_at_the_masks_minus_top1s(mlm):
    cand = _choice(TOP1, p4="股", p5="市")
    [[top1_gain, gain]] = mlm.gains([TOP1], [[tuple(TOP1), cand]])
    expected = _log_p(mlm, TOP1[:4], "股市", TOP1[6:]) - _log_p(mlm, TOP1[:4], "不是", TOP1[6:])
    assert top1_gain == 0.0
    assert gain == pytest.approx(expected, abs=1e-4)


def test_each_span_is_scored_in_top1s_context_and_the_gains_add(mlm):
    cand = _choice(TOP1, p0="渴", p8="在")
    [[_, gain]] = mlm.gains([TOP1], [[tuple(TOP1), cand]])
    first = _log_p(mlm, "", "渴", TOP1[1:]) - _log_p(mlm, "", "可", TOP1[1:])
    second = _log_p(mlm, TOP1[:8], "在", TOP1[9:]) - _log_p(mlm, TOP1[:8], "再", TOP1[9:])
    assert spans(TOP1, cand) == [(0, 1), (8, 9)]
    assert gain == pytest.approx(first + second, abs=1e-4)


def test_a_deletion_is_scored_with_the_next_character_and_per_character_against_top1(mlm):
    cand = _choice(TOP1, p4="")  # 不 deleted: the span widened to 不是 against 是
    [[_, gain]] = mlm.gains([TOP1], [[tuple(TOP1), cand]])
    mine = _log_p(mlm, TOP1[:4], "是", TOP1[6:])
    theirs = _log_p(mlm, TOP1[:4], "不是", TOP1[6:])
    assert gain == pytest.approx(2 * mine - theirs, abs=1e-4)


def test_equal_length_changes_of_one_span_share_one_masked_sentence_across_candidates(mlm, monkeypatch):
    rows: list[int] = []
    forward = mlm.model.forward

    def counting(*args, **kwargs):
        rows.append(int(kwargs["input_ids"].shape[0]))
        return forward(*args, **kwargs)

    monkeypatch.setattr(mlm.model, "forward", counting)
    cands = [tuple(TOP1), _choice(TOP1, p4="股", p5="市"), _choice(TOP1, p4="古", p5="是"), _choice(TOP1, p4="股")]
    mlm.gains([TOP1, "今天天氣很好"], [cands, [tuple("今天天氣很好")]])
    # spans (4, 6) with two masks and (4, 5) with one: two rows, in one forward pass; the unchanged list asks nothing
    assert rows == [2]


def test_lists_whose_candidates_are_all_top1_run_no_forward_pass(mlm, monkeypatch):
    monkeypatch.setattr(mlm.model, "forward", lambda *a, **k: pytest.fail("the model was run"))
    assert mlm.gains(["你好"], [[("你", "好")]]) == [[0.0]]


def test_in_int8_a_gain_is_the_fp32_ones_within_a_few_thousandths_whatever_the_batch(folder, mlm):
    int8 = MaskedLM(folder, "cpu")
    assert int8.precision == "int8" and mlm.precision == "fp32"
    cands = [tuple(TOP1), _choice(TOP1, p4="股", p5="市"), _choice(TOP1, p4=""), _choice(TOP1, p0="渴", p8="在")]
    car, stock = "車是已逐漸回溫", "今天股價上漲"
    lists = [TOP1, car, stock], [cands, [tuple(car), _choice(car, p1="市")], [tuple(stock), _choice(stock, p2="故")]]
    exact = [g for gains in mlm.gains(*lists) for g in gains]
    assert [g for gains in int8.gains(*lists) for g in gains] == pytest.approx(exact, abs=0.02)
    assert int8.gains([TOP1], [cands])[0] == pytest.approx(exact[: len(cands)], abs=0.02)


def test_a_sentence_longer_than_the_models_positions_gains_nothing(mlm):
    long = "股" * 200  # the tiny model reads 128 positions
    assert mlm.gains([long], [[tuple(long), ("市", *long[1:])]]) == [[0.0, 0.0]]


def test_a_gain_does_not_depend_on_the_lists_asked_beside_it(mlm):
    lists = [(TOP1, [tuple(TOP1), _choice(TOP1, p4="股", p5="市")]),
             ("車是已逐漸回溫", [tuple("車是已逐漸回溫"), _choice("車是已逐漸回溫", p1="市")]),
             ("今天股價上漲", [tuple("今天股價上漲"), _choice("今天股價上漲", p2="故")])]
    together = mlm.gains([t for t, _ in lists], [c for _, c in lists])
    alone = [mlm.gains([t], [c])[0] for t, c in lists]
    assert [g for gains in together for g in gains] == pytest.approx([g for gains in alone for g in gains], abs=1e-4)


@pytest.mark.parametrize("spoil, words", [
    (lambda f: shutil.rmtree(f), "is not a folder"),
    (lambda f: (f / "config.json").unlink(), "no readable config.json"),
    (lambda f: (f / "config.json").write_text("{not json"), "is not JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps({"hidden_size": 8})), "names no model_type"),
    (lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "holds no tokenizer"),
    (lambda f: (f / "model.safetensors").unlink(), "holds no masked-LM weights"),
])
def test_a_folder_that_is_no_masked_lm_is_refused_in_one_line_naming_it(folder, tmp_path, spoil, words):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    spoil(broken)
    with pytest.raises(MaskedLMError) as caught:
        check_folder(broken)
    assert words in str(caught.value) and str(broken) in str(caught.value) and "\n" not in str(caught.value)


def test_a_folder_whose_weights_file_is_cut_short_is_refused_at_load_in_one_line(folder, tmp_path):
    broken = tmp_path / "cut"
    shutil.copytree(folder, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(MaskedLMError) as caught:
        MaskedLM(broken, "cpu")
    assert "could not be loaded" in str(caught.value) and "\n" not in str(caught.value)


def test_a_tokenizer_without_chinese_characters_as_tokens_is_refused(tmp_path):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    english = tmp_path / "english"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "bank"]
    BertForMaskedLM(BertConfig(vocab_size=len(tokens), hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                               intermediate_size=8)).save_pretrained(english)
    BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}).save_pretrained(english)
    with pytest.raises(MaskedLMError, match="frequent Chinese characters"):
        MaskedLM(english, "cpu")
