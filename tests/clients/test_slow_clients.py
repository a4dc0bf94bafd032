"""testing/slow_clients.py against tiny servers in the test (tests/clients/fake_http.py), without gunicorn.

The tool holds slow connections open beside closed-loop clients and reports what the clients got; here a server
that answers at once, and one that never answers, check that the report says what happened.
"""

from __future__ import annotations

import json
from pathlib import Path

from testing.slow_clients import main
from tests.clients.fake_http import serving


def test_slow_clients_holds_its_slow_connections_and_counts_answers_in_time(tmp_path: Path, capsys):
    out = tmp_path / "slow.json"
    with serving("answer") as (url, served):
        code = main(["--url", url, "--slow", "20", "--clients", "2", "--seconds", "1", "--out", str(out)])
    result = json.loads(out.read_text(encoding="utf-8"))
    assert code == 0
    slow, questions = result["slow"], result["questions"]
    assert (slow["asked"], slow["open_at_start"], slow["held_min"]) == (20, 20, 20)  # this server never closes them
    assert slow["closed_by_server"] == 0
    assert questions["sent"] == questions["valid"] == questions["within_1s"] == len(served) > 0
    assert questions["within_1s_share"] == 1.0
    assert questions["late_sent_at_s"] == []
    assert result["tool_cpu_s"] >= 0
    assert "answered validly within 1 s (100.00 %)" in capsys.readouterr().out


def test_slow_clients_reports_questions_never_answered_and_exits_1(tmp_path: Path, capsys):
    out = tmp_path / "slow.json"
    with serving("silent") as (url, _):
        code = main(["--url", url, "--slow", "0", "--clients", "1", "--seconds", "0.5", "--timeout-s", "0.3",
                     "--out", str(out)])
    questions = json.loads(out.read_text(encoding="utf-8"))["questions"]
    assert code == 1
    assert questions["sent"] == questions["failed"] > 0
    assert questions["within_1s"] == 0
    assert questions["problems"] == {"timeout: no answer within 0.3 s": questions["sent"]}
    assert "0 answered validly within 1 s (0.00 %)" in capsys.readouterr().out
