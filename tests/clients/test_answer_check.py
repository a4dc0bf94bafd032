"""What every client tool shares: the one answer check (`testing.samples.check_answer`) and the one percentile
(`testing.load.percentile`, nearest rank). The load generators, the slow clients, the judge, the grequests
script and the JMeter results reader all go through these two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing.jtl import read_jtl, summary
from testing.load import percentile
from testing.samples import check_answer

VALID = {"esun_uuid": "u", "server_uuid": "s", "server_timestamp": 1.5, "answer": "好"}


@pytest.mark.parametrize("body", [VALID, json.dumps(VALID), json.dumps(VALID, ensure_ascii=False).encode()])
def test_check_answer_takes_a_valid_answer_parsed_or_raw(body: object):
    assert check_answer(200, body, "u") is None


@pytest.mark.parametrize(("status", "body", "problem"), [
    (503, VALID, "HTTP 503, want 200"),
    (200, b"<html>", "not JSON"),
    (200, "[1]", "not a JSON object"),
    (200, {**VALID, "extra": 1}, "want exactly"),
    (200, {k: v for k, v in VALID.items() if k != "server_uuid"}, "want exactly"),
    (200, {**VALID, "esun_uuid": "other"}, "is not the one sent"),
    (200, {**VALID, "answer": "好 的"}, "without spaces"),
    (200, {**VALID, "answer": ""}, "non-empty string"),
    (200, {**VALID, "answer": 1}, "non-empty string"),
    (200, {**VALID, "server_timestamp": "now"}, "server_timestamp must be a number"),
    (200, {**VALID, "server_uuid": 7}, "server_uuid must be a string"),
])
def test_check_answer_says_what_is_wrong(status: int, body: object, problem: str):
    assert problem in check_answer(status, body, "u")


def test_percentile_is_nearest_rank_a_value_some_request_really_had():
    values = [0.4, 0.1, 0.3, 0.2]
    assert [percentile(values, q) for q in (0, 25, 50, 75, 99, 100)] == [0.1, 0.1, 0.2, 0.3, 0.4, 0.4]
    assert percentile([], 50) is None


def test_jtl_summary_counts_failures_and_takes_the_shared_percentiles(tmp_path: Path):
    results = tmp_path / "results.jtl"
    results.write_text("timeStamp,elapsed,label,responseCode,success,failureMessage\n"
                       + "".join(f"{1000 + i},{10 * (i + 1)},inference,200,true,\n" for i in range(9))
                       + "1009,500,inference,503,false,HTTP 503\n", encoding="utf-8")
    samples = read_jtl(results)
    text = summary(samples)
    assert len(samples) == 10 and "1 failed" in text
    assert "p50 50 p95 500 p99 500 max 500" in text and "FAIL inference 503: HTTP 503" in text
