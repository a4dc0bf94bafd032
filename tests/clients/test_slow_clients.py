"""The benchmark's f (testing/bench.py, `--sections f --url`) against tiny servers in the test
(tests/clients/fake_http.py), without gunicorn.

The section holds slow connections open beside closed-loop clients and reports what the clients got; here a server
that answers at once, and one that never answers, check that the report says what happened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing import cli
from testing.bench import main
from tests.clients.fake_http import serving


def run_f(out: Path, url: str, slow: int, clients: int, seconds: float) -> tuple[int, dict]:
    """Run section f alone against `url`; return the exit status and the section's figures from bench.json."""
    code = main(
        [
            "--sections",
            "f",
            "--url",
            url,
            "--slow",
            str(slow),
            "--clients",
            str(clients),
            "--duration",
            str(seconds),
            "--out",
            str(out),
        ]
    )
    return code, json.loads((out / "bench.json").read_text(encoding="utf-8"))["f"]


def test_slow_clients_holds_its_slow_connections_and_counts_answers_in_time(tmp_path: Path, capsys):
    with serving("answer") as (url, served):
        code, result = run_f(tmp_path, url, slow=20, clients=2, seconds=1)
    assert code == 0
    slow = result["slow"]
    assert (slow["asked"], slow["open_at_start"], slow["held_min"]) == (20, 20, 20)  # this server never closes them
    assert slow["closed_by_server"] == 0 and slow["tool_cpu_pct"] >= 0
    assert 0 < result["requests"] == result["valid_within_1s"] == len(served)
    assert result["non_200"] == result["invalid"] == result["late_over_1s"] == 0
    assert "| 20 / 20.0 | 0 |" in capsys.readouterr().out


def test_slow_clients_reports_questions_never_answered_and_exits_1(tmp_path: Path, capsys):
    with serving("silent") as (url, _):
        code, result = run_f(tmp_path, url, slow=0, clients=1, seconds=0.5)
    assert code == 1
    assert result["requests"] == result["no_answer"] == result["late_over_1s"] > 0
    assert result["valid_within_1s"] == 0
    assert "| 0 (0.00 %) |" in capsys.readouterr().out


def test_url_goes_with_section_f_alone(tmp_path: Path):
    with pytest.raises(cli.ToolError, match="--url goes with --sections f alone"):
        main(["--sections", "b,f", "--url", "http://127.0.0.1:9", "--out", str(tmp_path)])
