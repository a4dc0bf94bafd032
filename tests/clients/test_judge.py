"""testing/judge.py against live servers: the service with a FakeCorrector, contract breakers, and no server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, jsonify, request

from api.metrics import METRICS_KEY
from config import Config
from learn.data.labelled import Labelled, read_labelled, write_labelled
from preprocess.text import NBest, han_chars
from testing.judge import MAX_RESPONSE_CHARS, judge, main, valid_answer

pytestmark = pytest.mark.live

SENTENCES = [
    ("喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"),
    ("我 想 查詢 信用卡 帳單", "我 想 查詢 信用卡 賬單"),
    ("請 幫 我 轉接 客服", "請 幫 我 轉 接 客服", "請 幫 我 轉接 課服"),
    ("今天 天氣 很 好",),
    ("我 要 掛失 金融卡", "我 要 掛 失 金融卡"),
]


@pytest.fixture
def labelled_file(tmp_path: Path) -> Path:
    """Write a tiny labelled JSONL file: five questions with their truths."""
    items = [Labelled(f"q{n}", "".join(s[0].split()), NBest(s, ("w eI4",))) for n, s in enumerate(SENTENCES)]
    path = tmp_path / "labelled.jsonl"
    write_labelled(items, path)
    return path


@pytest.fixture
def items(labelled_file: Path) -> list[Labelled]:
    return read_labelled(labelled_file)


def _contract_app(answer: Callable[[dict[str, Any]], tuple[Any, int]]) -> tuple[Flask, list[dict[str, Any]]]:
    """Build an app whose /inference records each body and replies with answer(body): (JSON, status)."""
    app = Flask("judge-test")
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    @app.post("/inference")
    def inference():
        body = request.get_json(force=True)
        with lock:
            seen.append(body)
        data, status = answer(body)
        return jsonify(data), status

    return app, seen


def _good(body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"esun_uuid": body["esun_uuid"], "server_uuid": "s", "server_timestamp": time.time(),
            "answer": han_chars(body["sentence_list"][0]), **extra}


def test_judge_answers_every_item_in_input_order_from_live_service(live_server: str, items: list[Labelled],
                                                                   corrector):
    run = judge(live_server, items, timeout_s=2.0, concurrency=3)

    assert [a.id for a in run.answers] == [i.id for i in items]
    assert [a.answer for a in run.answers] == [corrector.expected(i.nbest) for i in items]
    assert all(a.outcomes == ("answered",) and a.attempts == 1 for a in run.answers)
    assert [run.failed(o) for o in ("late", "non_200", "connection_error", "malformed")] == [0, 0, 0, 0]
    assert run.unanswered == 0
    assert len({a.esun_uuid for a in run.answers}) == len(items)
    assert all(len(a.esun_uuid) == 64 for a in run.answers)
    latency = run.latency_s()
    assert 0 < latency["p50_s"] <= latency["p90_s"] <= latency["p99_s"] <= latency["max_s"] < 2.0
    served = sorted(n.top1 for batch in corrector.batches for n in batch)
    assert served == sorted(s[0] for s in SENTENCES)


def test_judge_counts_late_first_attempt_and_takes_the_retrys_answer(
        make_app: Callable[..., Flask], make_live_server: Callable[[Flask], str], config: Config,
        fake_corrector, items: list[Labelled]):
    gate = threading.Event()  # holds every model batch: the service answers only at its own deadline (0.3 s)
    app = make_app(config, fake_corrector(gate=gate))
    url = make_live_server(app)
    try:
        run = judge(url, items, timeout_s=0.2, concurrency=len(items))
    finally:
        gate.set()
        # the late first attempts' views end (and write their log lines) within this test, not after it
        _wait_until_idle(app)

    assert all(a.outcomes == ("late", "answered") for a in run.answers)
    # the retry is answered at once by the service's retry guard: TOP1, the model has not answered yet
    assert [a.answer for a in run.answers] == [han_chars(i.nbest.top1) for i in items]
    assert all(a.latency_s < 0.2 for a in run.answers)
    assert (run.failed("late"), run.unanswered) == (len(items), 0)


def test_judge_resends_after_non_200_with_retry_counting_down(make_live_server: Callable[[Flask], str],
                                                             items: list[Labelled]):
    app, seen = _contract_app(lambda body: (_good(body), 200) if body["retry"] == 0 else ({"error": "x"}, 503))
    item = items[2]

    run = judge(make_live_server(app), [item], timeout_s=1.0)

    assert [b["retry"] for b in seen] == [2, 1, 0]
    assert {b["esun_uuid"] for b in seen} == {run.answers[0].esun_uuid}
    assert all(isinstance(b["esun_timestamp"], int) for b in seen)
    assert all(b["sentence_list"] == list(item.nbest.sentences) for b in seen)
    assert all(b["phoneme_sequence_list"] == list(item.nbest.phonemes) for b in seen)
    assert run.answers[0].outcomes == ("non_200", "non_200", "answered")
    assert run.answers[0].answer == han_chars(item.nbest.top1)
    assert (run.failed("non_200"), run.unanswered) == (2, 0)


def test_judge_counts_malformed_answer_as_failure_without_resending(make_live_server: Callable[[Flask], str],
                                                                   items: list[Labelled]):
    app, seen = _contract_app(lambda body: (_good(body, confidence=0.9), 200))
    url = make_live_server(app)

    run = judge(url, items, timeout_s=1.0)

    assert all(a.outcomes == ("malformed",) and a.answer is None and a.scored == "" for a in run.answers)
    assert (run.failed("malformed"), run.unanswered) == (len(items), len(items))
    assert run.latency_s()["max_s"] is None
    assert len(seen) == len(items)


def test_judge_counts_connection_errors_when_service_is_unreachable(items: list[Labelled]):
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    run = judge(f"http://127.0.0.1:{port}", items, timeout_s=0.5, concurrency=2)

    assert all(a.outcomes == ("connection_error",) * 3 and a.answer is None for a in run.answers)
    assert (run.failed("connection_error"), run.unanswered, run.failed("late")) == (3 * len(items), len(items), 0)
    assert run.latency_s()["p50_s"] is None


def test_judge_main_against_a_dead_port_counts_questions_not_their_retries(labelled_file: Path,
                                                                          capsys: pytest.CaptureFixture[str]):
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    assert main(["--data", str(labelled_file), "--url", f"http://127.0.0.1:{port}", "--timeout", "0.5"]) == 1
    assert capsys.readouterr().err.strip() == (f"error: {len(SENTENCES)} of {len(SENTENCES)} questions could not "
                                               f"connect to http://127.0.0.1:{port}: is the service running?")


@pytest.mark.parametrize("body", [
    "not json",
    json.dumps(["a list"]),
    json.dumps({"esun_uuid": "u", "server_uuid": "s", "server_timestamp": 1.0}),
    json.dumps({"esun_uuid": "u", "server_uuid": "s", "server_timestamp": 1.0, "answer": "好", "extra": 1}),
    json.dumps({"esun_uuid": "other", "server_uuid": "s", "server_timestamp": 1.0, "answer": "好"}),
    json.dumps({"esun_uuid": "u", "server_uuid": "s", "server_timestamp": 1.0, "answer": None}),
    json.dumps({"esun_uuid": "u", "server_uuid": 3, "server_timestamp": 1.0, "answer": "好"}),
    json.dumps({"esun_uuid": "u", "server_uuid": "s", "server_timestamp": True, "answer": "好"}),
    json.dumps({"esun_uuid": "u", "server_uuid": "s", "server_timestamp": 1.0, "answer": "好" * MAX_RESPONSE_CHARS}),
])
def test_valid_answer_refuses_what_the_judge_cannot_read(body: str):
    assert valid_answer(body, "u") is None


def test_valid_answer_reads_the_four_keys():
    body = json.dumps({"answer": "好", "esun_uuid": "u", "server_timestamp": 1, "server_uuid": "s"})

    assert valid_answer(body, "u") == "好"


def test_judge_main_prints_summary_and_refuses_malformed_file(live_server: str, labelled_file: Path,
                                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--data", str(labelled_file), "--url", live_server, "--timeout", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)[labelled_file.name]
    assert summary["questions"] == summary["sentences"] == len(SENTENCES) and summary["unanswered"] == 0
    # the fake corrector answers 改 + TOP1: one more error on every list, so each is made worse
    truths = [it.truth for it in read_labelled(labelled_file)]
    assert summary["made_worse"] == len(SENTENCES)
    assert summary["answer_cer"] == pytest.approx((summary["top1_cer"] * sum(map(len, truths)) + len(SENTENCES))
                                                  / sum(map(len, truths)))

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "ground_truth_sentence": "好"}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        main(["--data", str(bad), "--url", live_server])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == f"{bad}: line 1 (id '1'): sentence_list must be a non-empty list of " \
                                              "strings, got no such key"


def _wait_until_idle(app: Flask, timeout_s: float = 5.0) -> None:
    """Wait until the app has no /inference request in flight (its metrics' gauge)."""
    registry = app.extensions[METRICS_KEY].registry
    deadline = time.monotonic() + timeout_s
    while registry.get_sample_value("esun_requests_in_flight") and time.monotonic() < deadline:
        time.sleep(0.02)


def test_judge_with_a_missing_file_names_it_in_one_line(tmp_path, capsys):
    """Issue 62: a missing --data file printed a bare `[Errno 2]` line."""
    missing = tmp_path / "no_such.jsonl"

    with pytest.raises(SystemExit) as exited:
        main(["--data", str(missing)])

    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert str(missing) in err and "No such file or directory" in err
