"""testing/soak.py end to end on the fake corrector, briefly: each interval records every process of the server by
role, the latency and failures, the cache's growth, and the run writes its JSON, table and plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testing.server import REPO_ROOT

pytestmark = pytest.mark.live


def test_soak_records_each_interval_with_the_server_processes_and_the_cache(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "testing.soak", "--fake", "--minutes", "0.2", "--interval-s", "4", "--capacity", "40",
         "--share", "0.5", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads((tmp_path / "soak.json").read_text())
    assert results["rate_rps"] == 20.0 and results["request_pool"]["short"] == 300
    intervals = results["intervals"]
    assert len(intervals) == 3
    for record in intervals:
        assert record["requests"] > 0 and record["non_200"] == 0 and record["late_over_1s"] == 0
        assert record["by_role"]["master"]["processes"] == 1 and record["by_role"]["worker"]["processes"] >= 1
        assert all(p["rss_mib"] > 0 and p["fds"] > 0 and p["threads"] > 0 for p in record["processes"])
        assert record["p50_ms"] is not None and record["p99_ms"] >= record["p50_ms"]
    # every request a new esun_uuid: the worker's cache grows by what it answered
    assert 0 < intervals[0]["cache_entries"] < intervals[-1]["cache_entries"]
    assert results["plots"] == ["soak.png"] and (tmp_path / "soak.png").stat().st_size > 0
    assert "| minute |" in (tmp_path / "soak.md").read_text()


def test_soak_on_distinct_lists_counts_the_model_s_answers_and_full_collections_in_each_record(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "testing.soak", "--fake", "--distinct", "150", "--minutes", "0.14", "--interval-s", "4",
         "--capacity", "40", "--share", "0.5", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads((tmp_path / "soak.json").read_text())
    assert results["request_pool"]["distinct"] and results["request_pool"]["bodies"] == 150
    assert all(p["rss_mib"] > 0 for p in results["processes_at_start"])
    assert set(results["gc_full_at_start"]) == {"gc_full_collections", "gc_full_s"}
    first, last = results["intervals"]
    assert 0 < first["model_answers_so_far"] < last["model_answers_so_far"] <= first["requests"] + last["requests"]
    assert last["gc_full_collections"] >= results["gc_full_at_start"]["gc_full_collections"]
    assert "150 distinct lists" in run.stdout and "| model answers so far | full GC collections (s) |" in run.stdout


def _record(end_s: float, rss: float, fds: int = 11, threads: int = 73, late: int = 0) -> dict:
    role = {"processes": 1, "rss_mib": rss, "fds": fds, "threads": threads}
    return {"end_s": end_s, "late_over_1s": late, "non_200": 0,
            "by_role": {"worker": role, "model": {"processes": 0, "rss_mib": 0.0, "fds": 0, "threads": 0}}}


def test_steady_state_leaves_out_the_settling_minutes_and_reports_growth_and_ranges():
    from testing.soak import steady_line, steady_state

    intervals = [_record(60, 700), _record(120, 800, threads=70), _record(180, 810, late=1), _record(240, 790),
                 _record(300, 816, fds=12)]
    steady = steady_state(intervals, settle_s=120)
    assert steady is not None
    assert (steady["records"], steady["from_minute"], steady["to_minute"]) == (3, 3, 5)
    assert (steady["rss_first_mib"], steady["rss_last_mib"], steady["rss_growth_pct"]) == (810, 816, 0.74)
    assert (steady["rss_min_mib"], steady["rss_max_mib"]) == (790, 816)
    # the line through (3, 810), (4, 790), (5, 816): slope 3 MiB a minute, 6 MiB over the two minutes
    assert (steady["rss_trend_mib"], steady["rss_trend_pct"]) == (6.0, 0.75)
    assert steady["fds"] == [11, 12] and steady["threads"] == [73, 73] and steady["late_over_1s"] == 1
    assert "(+0.74 %), between 790.0 and 816.0, trend +6 MiB (+0.75 %)" in steady_line(steady)
    assert steady_state(intervals, settle_s=300) is None
    assert steady_line(None) == "no record after the settling minutes"
