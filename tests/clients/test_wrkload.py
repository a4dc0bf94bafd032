"""testing/wrkload.py and testing/wrk.lua: wrk's closed loop sends a fresh esun_uuid per request and brings back
each answer's status, timing and validity, and the requests it never got an answer to. Against tiny servers in
the test's own threads (tests/clients/fake_http.py); wrk itself must be installed (testing/install_tools.sh)."""

from __future__ import annotations

import pytest

from testing import wrkload
from testing.load import payload_templates
from testing.report import summarise
from tests.clients.fake_http import serving

TEMPLATES = payload_templates([{"esun_uuid": "", "sentence_list": ["喂 你好"], "retry": 2},
                               {"esun_uuid": "", "sentence_list": ["密碼 我 要 進去", "密碼 哇 進去"], "retry": 2}])


@pytest.fixture(autouse=True)
def wrk_installed() -> None:
    if wrkload.wrk_path() is None:
        pytest.fail("wrk is not installed: run `bash testing/install_tools.sh` (make test runs it first)")


def test_each_request_goes_out_under_its_own_uuid_and_comes_back_valid():
    with serving("answer") as (url, served):
        run = wrkload.closed_loop(url, 3, 1.0, 0.2, TEMPLATES)
    shots = run.shots
    assert run.generator["generator"] == "wrk" and shots and all(s.status == 200 and s.valid for s in shots)
    assert all(run.start <= s.due < run.end and s.latency_s > 0 for s in shots)
    uuids = [s.esun_uuid for s in shots]
    assert len(set(uuids)) == len(uuids) and set(uuids) <= set(served)
    assert all(len(u) == 64 for u in uuids)  # like the judge's
    assert run.generator["wrk_errors"]["connect"] == 0 and run.generator["generator_cpu_pct"] >= 0


def test_fresh_uuids_in_every_run_so_the_service_never_answers_from_its_cache():
    with serving("answer") as (url, _):
        first = {s.esun_uuid for s in wrkload.closed_loop(url, 1, 0.5, 0.1, TEMPLATES).shots}
        second = {s.esun_uuid for s in wrkload.closed_loop(url, 1, 0.5, 0.1, TEMPLATES).shots}
    assert first and second and not first & second


def test_error_answers_are_counted_as_non_200():
    with serving("unavailable") as (url, _):
        run = wrkload.closed_loop(url, 2, 0.5, 0.1, TEMPLATES)
    shots, summary = run.shots, summarise(run.shots, (run.start, run.end), {}, None)
    assert shots and {s.status for s in shots} == {503}  # each answered request once, none also "never answered"
    assert summary["non_200"] == len(shots) and summary["no_answer"] == 0
    assert run.generator["wrk_errors"]["status"] > 0


def test_requests_never_answered_are_reported_as_no_answer():
    with serving("silent") as (url, _):
        run = wrkload.closed_loop(url, 2, 0.5, 0.0, TEMPLATES)
    shots, summary = run.shots, summarise(run.shots, (run.start, run.end), {}, None)
    assert shots and all(s.status == 0 for s in shots)
    assert summary["no_answer"] == len(shots) >= 2  # at least one request per connection, none answered
