"""`python -m learn.explain`: what an adapted folder learned, and what it does to a labelled file (issue 39)."""

from __future__ import annotations

import pytest

from learn.data.labelled import write_labelled
from learn.explain import main
from tests.learn.test_adapt import _quick, _rows

pytestmark = pytest.mark.real_model


def test_explain_shows_the_trusted_rules_and_samples_of_what_the_folder_did(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)
    assert _quick(data, tmp_path / "out") == 0
    capsys.readouterr()
    assert main(["--weights", str(tmp_path / "out"), "--data", str(data), "--shown", "3"]) == 0
    out = capsys.readouterr().out
    assert "most trusted rules" in out and "| 台 → 臺 |" in out
    assert f"## {len(_rows(top1_alone=True))} lists of labelled.jsonl:" in out
    # the three groups, whichever the folder's answers fill (since issue 48 it leaves none of these lists wrong)
    assert "### made better (a sample of" in out and "### made worse" in out and "### left wrong (a sample of" in out


def test_explain_refuses_a_folder_that_is_not_adapted(capsys):
    assert main(["--weights", "model/weights"]) == 2
    assert "is not an adapted folder" in capsys.readouterr().err
