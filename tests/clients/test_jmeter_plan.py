"""The JMeter plan (testing/jmeter/): its request file, and a short run of it against a served service."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from api.schemas import parse_request
from config import Config
from testing.jtl import read_jtl
from testing.samples import real_bodies
from testing.server import ServerProcess

REQUESTS_CSV = Path(__file__).resolve().parents[2] / "testing" / "jmeter" / "requests.csv"
# Long enough for a few loops of 10 clients; the JVM's start adds a couple of seconds.
DURATION_S = 3
# The judge's relaxed timeout: a loaded CI machine should not fail the plumbing check at 1 s.
TIMEOUT_MS = 2000


def run_plan(run_sh: Path, port: int, results: Path, duration_s: int = DURATION_S) -> str:
    """Run the plan headless, its log beside the results; return its output and log, for failure messages."""
    log = results.with_suffix(".log")
    run = subprocess.run(
        [str(run_sh), "-l", str(results), "-j", str(log), "-Jhost=127.0.0.1", f"-Jport={port}",
         f"-Jduration={duration_s}", f"-Jtimeout_ms={TIMEOUT_MS}", "-Jsummariser.interval=5"],
        capture_output=True, text=True, timeout=120,
    )
    log_text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else "(no log)"
    output = f"exit {run.returncode}\n{run.stdout[-2000:]}{run.stderr[-2000:]}\njmeter.log:\n{log_text[-3000:]}"
    assert run.returncode == 0, output
    return output


def test_jmeter_requests_csv_holds_ten_different_valid_bodies_one_per_line():
    lines = REQUESTS_CSV.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 10
    assert not any("\t" in line for line in lines), "a tab would split a body in JMeter's tab-delimited CSV"
    bodies = [json.loads(line) for line in lines]
    for line in lines:
        parse_request(line.encode("utf-8"), Config())
    assert len({b["esun_uuid"] for b in bodies}) == 10
    assert len({tuple(b["sentence_list"]) for b in bodies}) == 10
    assert [b["sentence_list"] for b in bodies[:5]] == [b["sentence_list"] for b in real_bodies()]


@pytest.mark.live
def test_jmeter_plan_runs_with_no_failed_sample(served: ServerProcess, jmeter_run_sh: Path, tmp_path: Path):
    logged_before = len(served.request_log())
    results = tmp_path / "results.jtl"
    output = run_plan(jmeter_run_sh, int(served.url.rsplit(":", 1)[1]), results)
    # JMeter exits 0 even when the plan does not load: the results are the evidence.
    assert results.is_file(), f"JMeter wrote no results (did the plan load?):\n{output}"
    samples = read_jtl(results)
    assert samples, f"JMeter ran no sample:\n{output}"
    failed = [s for s in samples if not s.success]
    assert not failed, f"{len(failed)} of {len(samples)} samples failed, e.g. {failed[:3]}"
    assert {s.label for s in samples} == {"POST /inference"}
    # Each sample is a new question (fresh esun_uuid): none is answered from the cache.
    paths = served.paths(since=logged_before)
    assert sum(paths.values()) >= len(samples)
    assert "cached" not in paths


@pytest.mark.live
def test_jmeter_plan_fails_every_sample_that_breaks_the_contract(
    make_live_server, jmeter_run_sh: Path, tmp_path: Path
):
    from tests.clients.bad_app import create_bad_app

    base = make_live_server(create_bad_app())
    results = tmp_path / "results.jtl"
    output = run_plan(jmeter_run_sh, int(base.rsplit(":", 1)[1]), results, duration_s=2)
    samples = read_jtl(results) if results.is_file() else []
    assert samples, f"JMeter ran no sample:\n{output}"
    assert not any(s.success for s in samples)
    assert {s.code for s in samples} == {"200", "500"}
    messages = " ".join(s.message for s in samples if s.code == "200")
    assert "want exactly" in messages and "not JSON" in messages
