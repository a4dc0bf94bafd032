"""learn.diagnose: which second-stage feature alone prefers the better sentence, per set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from config import REPO_ROOT
from learn.data.labelled import Labelled, write_labelled
from learn.diagnose import diagnose, main, next_command
from learn.tune import DevList
from model.rerank import Features
from preprocess.text import NBest

NAMES = Features.names()


def _row(**values: float) -> list[float]:
    return [values.get(n, 0.0) for n in NAMES]


def test_diagnose_counts_what_each_feature_prefers_on_fixable_and_right_lists():
    fixable = DevList(  # TOP1 has 2 errors, candidate 2 none: lm prefers it, net prefers candidate 1
        feats=np.array([_row(), _row(lm=-1.0, net=2.0, changes=1.0), _row(lm=3.0, net=-1.0, changes=1.0)]),
        errors=np.array([2, 1, 0]),
        truth_len=4,
    )
    right = DevList(  # TOP1 right, the other candidate wrong and preferred by net only
        feats=np.array([_row(), _row(lm=-2.0, net=1.0, changes=1.0)]), errors=np.array([0, 1]), truth_len=4,
    )
    result = diagnose([fixable, right])
    assert (result.lists, result.fixable_lists, result.top1_right_lists) == (2, 1, 1)
    assert result.top1_cer == pytest.approx(2 / 8) and result.best_candidate_cer == 0.0
    lm, net, rank = result.signals["lm"], result.signals["net"], result.signals["rank"]
    assert (lm.prefers_better, lm.prefers_wrong) == (1.0, 0.0)
    assert (net.prefers_better, net.prefers_wrong) == (0.0, 1.0)
    assert rank.blind == 1.0


@pytest.mark.real_model
def test_diagnose_reads_a_labelled_file_and_prints_json(tmp_path, capsys):
    path = tmp_path / "set.jsonl"
    write_labelled([Labelled("q0", "股價上漲", NBest(("故價 上漲", "股價 上漲"))),
                    Labelled("q1", "我要進去", NBest(("我 要 進去", "我 哇 進去")))], path)
    assert main(["--data", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["set.jsonl"]
    assert (result["lists"], result["fixable_lists"], result["top1_right_lists"]) == (2, 1, 1)
    assert set(result["signals"]) == set(NAMES)


@pytest.mark.real_model
def test_diagnose_ends_its_tables_by_naming_the_command_to_run_next(tmp_path, capsys):
    path = tmp_path / "set.jsonl"
    write_labelled([Labelled("q0", "股價上漲", NBest(("故價 上漲", "股價 上漲")))], path)
    assert main(["--data", str(path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("next: mkdir -p adapted && cp -r model/weights adapted/tuned && .venv/bin/python -m "
                           "learn.tune --weights adapted/tuned --data ") and str(path) in last
    assert f'make adapt DATA="{path}" OUT=adapted/NAME' in last


def test_diagnose_never_suggests_writing_over_the_shipped_weights():
    """Its last line suggested `learn.tune --write` on model/weights, the shipped config (issue 41)."""
    assert "--weights adapted/tuned" in next_command([])
    assert next_command([], Path("mine")).startswith(".venv/bin/python -m learn.tune --weights mine --variant full")


def test_diagnose_run_by_a_python_without_the_project_packages_stops_in_one_line():
    """Regression: the README's `python -m learn.diagnose` under the system Python ended in a traceback."""
    done = subprocess.run([sys.executable, "-S", "-m", "learn.diagnose"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)  # -S: no site-packages, as a Python outside the .venv has
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("python -m learn.diagnose needs ")  # cli.missing_line, as every entry point's
    assert "run `.venv/bin/python -m learn.diagnose` after `make install-dev`" in done.stderr
