"""The error statistics (`learn.error_stats`) and the stand-in calibrated to the real data's (`standin`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learn.data import standin
from learn.error_stats import (
    REAL,
    REAL_HARDNESS,
    REAL_HELD_OUT,
    REAL_LISTS,
    TOLERANCE_CER,
    TOLERANCE_DISTINCT,
    TOLERANCE_LENGTH,
    TOLERANCE_SEEN,
    TOLERANCE_SHARE,
    against,
    classify_span,
    error_stats,
)
from learn.data.labelled import Labelled, read_labelled, write_labelled
from preprocess.phones import text_phones
from learn.data.real_profile import HARD
from learn.data.real_profile import render
from learn.data.standin import top1_only
from learn.data.standin_real import build_real
from preprocess.text import NBest


@pytest.mark.parametrize(("source", "target", "cls"), [
    ("痾", "呃", "filler"), ("呃", "嗯", "filler"), ("", "呃", "filler"), ("嗯", "", "filler"),
    ("週", "周", "variant"), ("佈", "布", "variant"), ("台", "臺", "variant"),
    ("再", "在", "homophone"), ("得", "的", "homophone"), ("新用", "信用", "homophone"),
    ("辛", "星", "near"), ("四", "是", "near"), ("三成", "山城", "near"),
    ("卷", "券", "other"), ("我", "你", "other"), ("大好", "打掃", "other"),
    ("了", "", "added"), ("那個", "", "added"),
    ("", "我", "dropped"), ("", "的話", "dropped"),
    ("信", "信用", "other_length"), ("什麼", "甚", "other_length"),
])  # fmt: skip
def test_classify_span_names_each_class(source: str, target: str, cls: str):
    assert classify_span(source, target) == cls


def test_error_stats_pools_cer_and_counts_one_span_lists():
    pairs = [
        ("我要 繳費", "我要繳費"),  # right (spaces are not characters)
        ("我要腳費", "我要繳費"),  # one span: homophone
        ("痾我要腳費了", "呃我要繳費"),  # three spans: filler, homophone, added
        ("信用卡", "信用卡帳單"),  # one span: dropped
    ]
    stats = error_stats(pairs)
    assert stats.lists == 4
    assert stats.top1_right == pytest.approx(0.25)
    assert stats.cer == pytest.approx((0 + 1 + 3 + 2) / (4 + 4 + 5 + 5))
    assert stats.truth_chars == pytest.approx(18 / 4)
    assert stats.one_span == pytest.approx(2 / 3)
    assert stats.rewrites.spans == 5
    assert stats.span_share["homophone"] == pytest.approx(2 / 5)
    assert stats.span_share["filler"] == pytest.approx(1 / 5)
    assert stats.char_share["dropped"] == pytest.approx(2 / 6)  # weighted by the longer side
    assert stats.rewrites.distinct == 4 and stats.rewrites.twice == 1  # 腳 -> 繳 twice
    assert stats.rewrites_at_real is None  # fewer than REAL_LISTS lists


def test_against_counts_the_other_files_spans_seen_here():
    stats = error_stats([("我要腳費", "我要繳費"), ("腳費", "繳費"), ("再見", "在見")])
    seen = against(stats, [("腳費多少", "繳費多少"), ("再來", "在來"), ("大家", "打架")])
    assert seen.spans == 3
    assert seen.seen == pytest.approx(2 / 3)
    assert seen.seen_twice == pytest.approx(1 / 3)


def test_stats_cli_prints_the_table_beside_the_real_figures(tmp_path: Path, capsys, monkeypatch):
    path = tmp_path / "lists.jsonl"
    write_labelled([Labelled("a", "我要繳費", NBest(("我要 腳費",))), Labelled("b", "你好", NBest(("你好",)))], path)
    monkeypatch.setattr("sys.argv", ["standin", "--stats", str(path), "--against", str(path), "--no-hardness"])
    standin.main()
    out = capsys.readouterr().out
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")] for line in out.splitlines())}
    assert rows["TOP1 exactly right"] == ["50.0 %", "50.6 %"]
    assert not any(key.startswith("hardness") for key in rows)
    assert rows["TOP1 CER (pooled)"][0] == "16.7 %"  # 1 edit in 6 characters
    assert "  homophone: % of spans / % of error characters" in out
    assert rows["other file's spans seen here / seen twice+"][0] == "100.0 % / 0.0 %"


@pytest.mark.real_model
def test_stats_cli_prints_the_hardness_measures_beside_the_real_ones(tmp_path: Path, capsys, monkeypatch):
    """Lists whose recogniser always writes 卷 for 券: the memo learns it and fixes every held-out one."""
    rows = [Labelled(f"l{k}", f"我有{k}張優惠券", NBest((f"我 有 {k} 張 優惠卷",))) for k in range(10)]
    path = tmp_path / "lists.jsonl"
    write_labelled(rows, path)
    monkeypatch.setattr("sys.argv", ["standin", "--stats", str(path)])
    standin.main()
    out = capsys.readouterr().out
    table = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")] for line in out.splitlines())}
    assert table["rule memo vs TOP1, margin 0 (lists made worse)"] == ["-100.0 % (0)", "-4.4 % (10)"]
    assert table["rate quartiles of rules seen twice+ (share at 0.5+)"][1] == "0.03 / 0.13 / 0.50 (28 %)"


def test_render_spaces_hypotheses_as_the_truths_words():
    words = ["我", "要", "繳費", "了"]
    assert render(words, []) == "我 要 繳費 了"
    assert render(words, [(2, 3, "腳")]) == "我 要 腳費 了"
    assert render(words, [(0, 0, "呃"), (4, 5, "")]) == "呃 我 要 繳費"
    assert render(words, [(1, 3, "藥教")]) == "我 藥教費 了"  # a rewrite across words stays in the first


@pytest.fixture(scope="module")
def real(corpus_dir: Path) -> tuple[list[Labelled], list[Labelled]]:
    train, test, _, _ = build_real(corpus_dir, REAL_LISTS, REAL_HELD_OUT, seed=31)
    return train, test


@pytest.fixture(scope="module")
def hard(corpus_dir: Path) -> tuple[list[Labelled], list[Labelled]]:
    train, test, _, _ = build_real(corpus_dir, REAL_LISTS, REAL_HELD_OUT, seed=31, config=HARD)
    return train, test


@pytest.mark.parametrize("profile", ["real", pytest.param("hard", marks=pytest.mark.real_model)])
def test_real_and_hard_standins_match_the_real_figures_within_the_tolerances(profile: str, request):
    train, test = request.getfixturevalue(profile)
    stats = error_stats([(it.nbest.top1, it.truth) for it in train])
    seen = against(stats, [(it.nbest.top1, it.truth) for it in test])
    assert abs(stats.top1_right - REAL.top1_right) <= TOLERANCE_SHARE
    assert abs(stats.cer - REAL.cer) <= TOLERANCE_CER
    assert abs(stats.truth_chars - REAL.truth_chars) <= TOLERANCE_LENGTH
    assert abs(stats.one_span - REAL.one_span) <= TOLERANCE_SHARE
    for cls, share in REAL.span_share.items():
        assert abs(stats.span_share[cls] - share) <= TOLERANCE_SHARE, cls
    for cls, share in REAL.char_share.items():
        assert abs(stats.char_share[cls] - share) <= TOLERANCE_SHARE, cls
    length_changes = sum(stats.char_share[c] for c in standin.LENGTH_CHANGES)
    assert abs(length_changes - REAL.char_share_length_changes) <= TOLERANCE_SHARE
    at = stats.rewrites_at_real
    assert at is not None
    assert abs(at.distinct / REAL.distinct - 1) <= TOLERANCE_DISTINCT
    assert abs(at.twice / REAL.twice - 1) <= TOLERANCE_DISTINCT
    assert abs(at.top_share - REAL.top_share) <= TOLERANCE_SHARE
    assert seen.seen_at_real is not None and seen.seen_twice_at_real is not None
    assert abs(seen.seen_at_real - REAL.seen) <= TOLERANCE_SEEN
    assert abs(seen.seen_twice_at_real - REAL.seen_twice) <= TOLERANCE_SEEN


def test_real_standin_lists_the_truth_below_a_wrong_top1_in_about_three_of_four(real):
    train, test = real
    items = train + test
    wrong = [it for it in items if it.nbest.top1.replace(" ", "") != it.truth]
    listed = [it for it in wrong if it.truth in [h.replace(" ", "") for h in it.nbest.sentences[1:]]]
    assert 0.7 <= len(listed) / len(wrong) <= 0.8
    ranks = {[h.replace(" ", "") for h in it.nbest.sentences].index(it.truth) + 1 for it in listed}
    assert ranks == set(range(2, 11))


def test_real_standin_hypotheses_are_ten_distinct_spaced_and_phoned(real):
    train, test = real
    assert not {it.truth for it in train} & {it.truth for it in test}
    assert not {it.id for it in train} & {it.id for it in test}
    for it in train[:500] + test:
        hyps = it.nbest.sentences
        assert len(hyps) == 10
        assert len({h.replace(" ", "") for h in hyps}) == 10
        assert all(h == " ".join(h.split()) and h for h in hyps)
        assert it.nbest.phonemes == tuple(text_phones(h) for h in hyps)


def test_real_standin_test_file_is_seeded_and_independent_of_the_train_size(corpus_dir: Path, real):
    _, test, _, _ = build_real(corpus_dir, 200, 100, seed=31)
    assert test == real[1][:100]


def test_write_real_writes_top1_files_that_truncate_the_nbest_files(corpus_dir: Path, tmp_path: Path):
    standin.write_real(corpus_dir, tmp_path, 60, 30, seed=5, t0=0.0)
    for name in ("train", "test"):
        nbest = read_labelled(tmp_path / f"nbest_{name}.jsonl")
        top1 = read_labelled(tmp_path / f"top1_{name}.jsonl")
        assert top1 == top1_only(nbest)
        assert all(len(it.nbest.sentences) == 1 and not it.nbest.phonemes for it in top1)
    assert len(read_labelled(tmp_path / "nbest_train.jsonl")) == 60
    assert json.loads((tmp_path / "recogniser.json").read_text(encoding="utf-8"))["profile"] == "real"


# The hardness the real lists show (issue 39): a tolerance per measure.
TOLERANCE_HARD_SHARE = 0.05  # the two LM-preference shares
TOLERANCE_QUARTILE = 0.1
TOLERANCE_MEMO = 0.02  # the memo's relative CER change


def _hardness(lists: list[Labelled]):
    from learn.memo_baseline import hardness
    from model.lm import LanguageModel

    pairs = [(it.nbest.top1, it.truth) for it in lists]
    return hardness(pairs[: REAL_LISTS - REAL_HELD_OUT], pairs[REAL_LISTS - REAL_HELD_OUT :], LanguageModel())


@pytest.mark.real_model
def test_hard_standin_errors_are_as_plausible_to_the_trigram_as_real_ones(hard, real):
    """On real lists the shipped trigram prefers the truth to a wrong TOP1 in 60.7 % of them (64.0 % with a
    character trigram of the taught truths); on the real profile in about 89 %: its errors were non-words."""
    got = _hardness(hard[0])
    assert abs(got.lm_prefers_truth - REAL_HARDNESS.lm_prefers_truth) <= TOLERANCE_HARD_SHARE
    assert abs(got.lm_chars_prefers_truth - REAL_HARDNESS.lm_chars_prefers_truth) <= TOLERANCE_HARD_SHARE
    assert _hardness(real[0]).lm_prefers_truth > REAL_HARDNESS.lm_prefers_truth + 0.2


# Strict, so that it says so the day it holds. On the hard profile's first 2,562 lists the quartiles of the taught
# rules' rates are 0.04 / 0.12 / 0.67 (real: 0.03 / 0.13 / 0.50; the real profile's 0.13 / 0.40 / 1.00): a quarter of
# the rules still act every time their source is seen. The memo gains -2.1 % / -2.4 % (real: -4.4 % / -3.4 %).
# Over seeds 31-36 the upper quartile is 0.67 +- 0.11 (one sample's noise is that wide) and the memo -1.9 +- 1.0 % /
# -2.3 +- 0.8 %: the memo is the firm gap (docs/model.md, "How much each hardness measure moves between seeds").
@pytest.mark.real_model
@pytest.mark.xfail(strict=True, reason="the hard profile's rules: upper quartile and memo off (issue 39, item 1)")
def test_hard_standin_rules_are_as_unreliable_as_real_ones(hard):
    h = _hardness(hard[0])
    for got, want in zip(h.rate_quartiles, REAL_HARDNESS.rate_quartiles, strict=True):
        assert abs(got - want) <= TOLERANCE_QUARTILE
    for margin, want in REAL_HARDNESS.memo_cer_change.items():
        assert abs(h.memo_cer_change[margin] - want) <= TOLERANCE_MEMO


@pytest.mark.real_model
def test_hard_standin_is_the_same_whatever_the_hash_seed(corpus_dir: Path, tmp_path: Path):
    """Regression: the hard profile drew its fluent errors from a set of words, in the strings' hash order, so two
    runs with the same seed wrote different lists (and different hardness figures)."""
    written = []
    for hash_seed in ("1", "2"):
        out = tmp_path / hash_seed
        subprocess.run([sys.executable, "-m", "learn.data.standin", "--profile", "hard", "--corpus", str(corpus_dir),
                        "--train", "60", "--test", "30", "--out", str(out)],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": hash_seed},
                       cwd=Path(__file__).resolve().parents[3])
        written.append([(out / f"nbest_{name}.jsonl").read_bytes() for name in ("train", "test")])
    assert written[0] == written[1]
