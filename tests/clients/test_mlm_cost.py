"""testing/mlm_cost.py: a batch of 64 timed with and without a masked LM, its table, JSON and plot written."""

from __future__ import annotations

import json

import pytest

from testing import mlm_cost
from tests.model.tiny_mlm import tiny_masked_lm

pytestmark = pytest.mark.real_model


def test_mlm_cost_times_batches_with_and_without_the_masked_lm_and_writes_its_record(tmp_path, capsys):
    mlm = tiny_masked_lm(tmp_path / "mlm")
    assert mlm_cost.main(["--mlm-dir", str(mlm), "--batches", "2", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "mlm_cost.json").read_text(encoding="utf-8"))
    assert len(result["raw_ms"]["with"]) == len(result["raw_ms"]["without"]) == 2
    assert result["median_rows_per_batch"] > 0  # the masked LM was asked about the batches' changes
    assert result["masked_lm"]["path"] == str(mlm) and result["machine"]["logical_cpus"] >= 1
    assert (tmp_path / "out" / "mlm_cost.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| without the masked LM |" in printed and "| with it |" in printed


def test_mlm_cost_names_a_folder_that_is_no_masked_lm_in_one_line(tmp_path, capsys):
    assert mlm_cost.main(["--mlm-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mlm_cost: ") and "is not a folder" in err
