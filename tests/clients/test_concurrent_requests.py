"""testing/concurrent_requests.py: N different requests at once, each answer checked as the judge would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testing.server import REPO_ROOT, ServerProcess

pytestmark = pytest.mark.live


def run_script(url: str, *args: str) -> subprocess.CompletedProcess:
    # Its own process: grequests monkey-patches the standard library with gevent on import.
    return subprocess.run([sys.executable, "-m", "testing.concurrent_requests", "--url", url, *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_concurrent_requests_reports_every_answer_valid(served: ServerProcess):
    logged_before = len(served.request_log())
    run = run_script(served.url, "-n", "12", "--timeout", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1 + 12 + 1  # header, one line per request, totals
    assert lines[-1].endswith("12 valid, 0 failed")
    assert "total" in lines[-1]
    assert sum(served.paths(since=logged_before).values()) == 12


def test_concurrent_requests_exits_nonzero_when_any_answer_breaks_the_contract(make_live_server):
    from tests.clients.bad_app import create_bad_app

    run = run_script(make_live_server(create_bad_app()), "-n", "6", "--size", "3")
    assert run.returncode == 1
    assert "FAIL" in run.stdout and "0 valid, 6 failed" in run.stdout
