"""`python -m learn.crossval`: `learn.adapt` cross-validated on one labelled file the tests write (issue 48), and
`learn.limits`' count of what limits the adapted model."""

from __future__ import annotations

import json

import pytest

from learn.crossval import fold_of, main, pooled, write_folds
from learn.data.labelled import Labelled, read_labelled, write_labelled
from learn.limits import OUTCOMES
from tests.learn.test_adapt import _rows

pytestmark = pytest.mark.real_model


def test_folds_cut_the_file_by_id_each_row_held_out_once(tmp_path):
    items = _rows(top1_alone=True)
    dirs = write_folds(items, tmp_path, 3, seed=5)
    held = [it.id for d in dirs for it in read_labelled(d / "test.jsonl")]
    assert sorted(held) == sorted(it.id for it in items)
    for k, d in enumerate(dirs):
        train = {it.id for it in read_labelled(d / "train.jsonl")}
        assert train.isdisjoint(it.id for it in read_labelled(d / "test.jsonl"))
        assert all(fold_of(i, 5, 3) != k for i in train)
    assert [fold_of(it.id, 5, 3) for it in items] == [fold_of(it.id, 5, 3) for it in items[::-1]][::-1]


def test_pooled_figures_sum_characters_not_rates():
    fold = {"sentences": 1, "made_better": 1, "made_worse": 0, "top1_right": 0, "top1_right_changed": 0}
    folds = [{"chars": 10, "models": {"m": fold | {"top1_cer": 0.1, "answer_cer": 0.0}}},
             {"chars": 30, "models": {"m": fold | {"top1_cer": 0.2, "answer_cer": 0.2}}}]
    total = pooled(folds)["m"]
    assert total["top1_cer"] == pytest.approx(7 / 40) and total["answer_cer"] == pytest.approx(6 / 40)
    assert total["sentences"] == 2 and total["made_better"] == 2


def _twice() -> list[Labelled]:
    """The adapt tests' lists twice over (other ids): each fold's other folds hold the 50 lists adapt needs."""
    rows = _rows(top1_alone=True)
    return rows + [Labelled(f"{it.id}-again", it.truth, it.nbest) for it in rows]


def test_crossval_adapts_on_the_other_folds_and_scores_the_held_one(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_twice(), data)
    out = tmp_path / "cv"
    flags = ["--epochs=0", "--dev-share=0.4", "--test-share=0.2", "--folds=2", "--device=cpu"]
    assert main(["--data", str(data), "--out", str(out), "--folds", "2", "--limits",
                 *[f"--adapt-arg={f}" for f in flags]]) == 0
    printed = capsys.readouterr().out
    assert "## cross-validated, 2 folds (seed 0)" in printed and "### adapted" in printed and "**all**" in printed
    report = json.loads((out / "crossval.json").read_text(encoding="utf-8"))
    assert [f["fold"] for f in report["per_fold"]] == [0, 1]
    assert report["pooled"]["adapted"]["sentences"] == len(_twice())
    for fold in report["per_fold"]:
        assert {"shipped", "adapted", "memo (margin 0)", "memo (margin 2)"} <= set(fold["models"])
        limits = fold["limits"]
        assert {key.split("/")[1] for key in limits["spans"]} <= set(OUTCOMES)
        # every wrong TOP1's spans are counted once: here one span each (台 written for 臺)
        assert sum(limits["spans"].values()) == limits["lists"]["wrong"]
    assert (out / "fold0" / "adapted" / "config.json").is_file() and (out / "crossval.md").is_file()
