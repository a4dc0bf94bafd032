"""testing/load.py, the load-generator core: its open and closed loops count every request once, with its status, and
tell connection errors from timeouts. Against tiny servers in the test's own threads (tests/clients/fake_http.py)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from testing import load
from testing.load import payload_templates
from testing.report import connection_error, summarise
from tests.clients.fake_http import closed_port, never_accepting, serving

TEMPLATES = payload_templates([{"esun_uuid": "", "sentence_list": ["喂 你好"], "retry": 2},
                               {"esun_uuid": "", "sentence_list": ["密碼 我 要 進去", "密碼 哇 進去"], "retry": 2}])


def test_parse_answer_waits_for_the_whole_body_then_reads_keep_alive():
    raw = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n\r\n{"answer":1}'
    assert load.parse_answer(bytearray(raw[:40])) is None
    answer, used = load.parse_answer(bytearray(raw))
    assert (answer.status, answer.body, answer.keep_alive, used) == (200, b'{"answer":1', True, len(raw) - 1)


def test_parse_answer_reads_connection_close_and_refuses_a_chunked_answer():
    raw = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
    answer, used = load.parse_answer(bytearray(raw))
    assert (answer.status, answer.body, answer.keep_alive, used) == (503, b"abc", False, len(raw))
    with pytest.raises(ValueError, match="chunked"):
        load.parse_answer(bytearray(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"))


def test_parse_answer_without_a_length_ends_when_the_connection_does():
    raw = bytearray(b"HTTP/1.0 200 OK\r\n\r\nbody")
    assert load.parse_answer(raw) is None
    answer, _ = load.parse_answer(raw, closed=True)
    assert (answer.body, answer.keep_alive) == (b"body", False)


def test_parse_answer_refuses_what_is_not_http():
    with pytest.raises(ValueError, match="not an HTTP status line"):
        load.parse_answer(bytearray(b"SSH-2.0-OpenSSH\r\n\r\n"))


def test_poisson_offsets_are_increasing_within_the_run_at_about_the_rate():
    offsets = load.poisson_offsets(1000.0, 2.0, seed=1)
    assert offsets == sorted(offsets) and offsets[0] > 0 and offsets[-1] < 2.0
    assert 1800 < len(offsets) < 2200


def test_open_loop_records_every_due_request_once_with_its_answer_on_reused_connections():
    with serving("answer") as (url, served):
        run = load.run(load.open_loop(url, 200.0, 1.0, 0.2, TEMPLATES, timeout_s=2.0, seed=3))
    shots = run.shots
    assert len(shots) == len([t for t in load.poisson_offsets(200.0, 1.2, 3) if t >= 0.2])
    assert all(s.status == 200 and s.valid for s in shots)
    assert all(run.start <= s.due < run.end for s in shots)
    assert {s.esun_uuid for s in shots} <= set(served) and len({s.esun_uuid for s in shots}) == len(shots)
    assert run.generator["connections_reused"] > 0  # keep-alive: not a connection per request
    assert all(s.latency_s >= s.lag_s for s in shots)  # counted from the due time, the send lag included


def test_closed_loop_keeps_each_client_one_request_in_flight_on_its_own_kept_alive_connection():
    with serving("answer") as (url, served):
        run = load.run(load.closed_loop(url, 4, 1.0, 0.2, TEMPLATES, timeout_s=2.0, answers=True))
    shots = run.shots
    assert shots and all(s.status == 200 and s.valid and s.answer == "好" for s in shots)
    assert all(run.start <= s.due < run.end for s in shots)
    assert len({s.esun_uuid for s in shots}) == len(shots) and {s.esun_uuid for s in shots} <= set(served)
    assert {s.question for s in shots} == {0, 1}  # the bodies in turn
    assert run.generator["connections_opened"] == 4  # one a client, each reused for the next request
    assert run.generator["connections_reused"] > 0 and run.generator["generator_cpu_pct"] >= 0


def test_closed_loop_runs_until_told_to_stop_and_its_window_ends_there():
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    with serving("answer") as (url, _):
        started = time.time()
        run = load.run(load.closed_loop(url, 2, math.inf, 0.0, TEMPLATES, until=stop))
    assert run.shots and all(s.valid and s.answer is None for s in run.shots)
    assert 0.4 < run.end - started < 1.0 and all(s.due < run.end for s in run.shots)


def test_non_200_answers_are_counted_with_their_status():
    with serving("unavailable") as (url, _):
        run = load.run(load.open_loop(url, 50.0, 0.5, 0.1, TEMPLATES, timeout_s=2.0))
    shots, summary = run.shots, summarise(run.shots, (run.start, run.end), {}, None)
    assert shots and {s.status for s in shots} == {503}
    assert summary["non_200"] == len(shots) and summary["connection_errors"] == 0 and summary["no_answer"] == 0


def test_a_refused_connection_is_a_connection_error_not_a_timeout():
    run = load.run(load.open_loop(closed_port(), 50.0, 0.5, 0.1, TEMPLATES, timeout_s=2.0))
    shots, summary = run.shots, summarise(run.shots, (run.start, run.end), {}, None)
    assert shots and all(s.status == 0 and s.problem.startswith("connection: ") for s in shots)
    assert summary["connection_errors"] == summary["no_answer"] == len(shots)


def test_an_answer_cut_mid_way_is_a_connection_error():
    with serving("cut") as (url, _):
        shots = load.run(load.open_loop(url, 20.0, 0.5, 0.1, TEMPLATES, timeout_s=2.0)).shots
    assert shots and all(s.status == 0 and connection_error(s) and "cut mid-answer" in s.problem for s in shots)


def test_a_server_that_never_answers_times_out_each_request_at_its_deadline():
    with serving("silent") as (url, _):
        shots = load.run(load.open_loop(url, 20.0, 0.5, 0.1, TEMPLATES, timeout_s=0.3)).shots
    assert shots and all(s.status == 0 and s.problem == "timeout: no answer within 0.3 s" and not connection_error(s)
                         for s in shots)
    assert all(s.latency_s >= 0.3 for s in shots)  # none given up before its deadline


def test_a_server_that_never_accepts_times_out_each_request_including_its_connect():
    with never_accepting() as url:
        run = load.run(load.open_loop(url, 40.0, 0.5, 0.0, TEMPLATES, timeout_s=0.5))
    shots = run.shots
    assert shots and all(s.status == 0 and s.problem.startswith("timeout: ") for s in shots)
    assert any(s.problem == "timeout: no connection in time" for s in shots)  # the listen queue was full
    assert run.generator["connections_opened"] < len(shots)


def test_load_help_says_what_the_module_is_and_which_tools_run_it():
    """Issue 62: `python -m testing.load --help` printed nothing."""
    import subprocess
    import sys

    from testing.server import REPO_ROOT

    run = subprocess.run([sys.executable, "-m", "testing.load", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)

    assert run.returncode == 0 and run.stderr == ""
    assert "load-generator core" in run.stdout and "testing.bench" in run.stdout
