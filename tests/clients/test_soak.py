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
