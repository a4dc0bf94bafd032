"""How a file's lists are shaped (`learn.list_shape`, issue 60)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from learn.list_shape import differing, read_rows, runs, shape

REPO = Path(__file__).resolve().parents[2]


def test_differing_names_the_top1_positions_a_hypothesis_writes_otherwise():
    assert differing("我要繳費", "我要腳費") == [2]
    assert differing("我要繳費", "我要繳費") == []
    assert differing("我要繳費", "你要繳費了") == [0, 3]  # an insertion rides on the position before it


def test_runs_counts_stretches_of_adjacent_positions():
    assert runs([]) == 0
    assert runs([2, 3, 4]) == 1
    assert runs([0, 2, 3, 7]) == 3


def test_shape_measures_how_far_lower_hypotheses_stray_and_where_the_truth_is():
    rows = [
        (["我要繳費", "我要腳費", "我要叫費", "我要繳廢"], "我要繳廢"),  # wrong TOP1, truth 4th
        (["今天很好", "金天很好"], "今天很好"),  # right TOP1
    ]
    got = shape("two", rows)
    assert got.lists == 2 and got.hypotheses == 3.0
    assert got.differ == pytest.approx((1 / 4 + 1 / 4) / 2)  # each lower hypothesis differs at one of four
    assert got.any_differ == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert got.spans == 1.0 and got.at_most_two_spans == 1.0
    assert got.places == pytest.approx((2 / 1 + 1 / 1) / 2)
    assert got.wrong_top1 == 1 and got.truth_listed == 1.0
    assert got.truth_rank_quartiles == (4.0, 4.0, 4.0)


def test_a_request_file_is_measured_without_the_truth_columns(tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"esun_uuid": "a", "sentence_list": ["我 要 繳費", "我 要 腳費"]},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    got = shape("requests", read_rows(path))
    assert got.wrong_top1 is None and got.truth_listed is None and got.truth_rank_quartiles is None
    assert got.differ == pytest.approx(1 / 4)


def test_the_command_prints_a_row_per_file_writes_json_and_names_an_unreadable_file(tmp_path: Path):
    out = tmp_path / "shape.json"
    run = subprocess.run([sys.executable, "-m", "learn.list_shape", "testing/data/real_requests.jsonl",
                          "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "real_requests.jsonl" in run.stdout and "any differ" in run.stdout
    assert json.loads(out.read_text(encoding="utf-8"))[0]["lists"] == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "learn.list_shape", str(bad)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    assert str(bad) in run.stderr and "Traceback" not in run.stderr


def test_the_command_measures_a_simulated_set_by_name():
    run = subprocess.run([sys.executable, "-m", "learn.list_shape", "--sets", "test", "--limit", "50"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "simulated test" in run.stdout
