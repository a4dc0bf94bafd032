"""testing/bench.py end to end on the fake corrector: the policy section runs, writes its tables and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testing.server import REPO_ROOT

pytestmark = pytest.mark.live


def test_bench_policy_section_compares_both_policies_in_abba_rounds(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "testing.bench", "--quick", "--fake", "--sections", "d", "--duration", "1",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    d = results["d"]
    for policy in ("fixed", "adaptive"):
        assert [p["clients"] for p in d[policy]] == [1, 10, 64]
        assert all(p["non_200"] == 0 and p["requests"] > 0 for p in d[policy])
        # the generator's own CPU share is reported beside every point (it shares the machine with the server)
        assert all(0 < p["generator_cpu_pct"] <= 100 * (os.cpu_count() or 1) for p in d[policy])
        assert len(d["throughput_rounds"]["rounds"][policy]) == 1  # --quick: 2 rounds, A then B
    assert d["throughput_rounds"]["adaptive_over_fixed"] > 0
    assert "ABBA rounds" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "d_policy_latency_by_clients.png").stat().st_size > 0
