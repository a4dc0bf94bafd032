"""The paths a request can take: retry, too long, no Han character, cached, model, deadline, overload, error."""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest

from api.answers import cache_key
from api.state import EXTENSION_KEY
from preprocess.text import NBest, top1_answer

LONG_TOP1 = " ".join(["我們"] * 23)  # 46 characters without spaces: one over max_top1_chars


def post(client, body):
    response = client.post("/inference", json=body)
    assert response.status_code == 200
    return response.get_json()["answer"]


def wait_until(predicate, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_inference_answers_with_the_model_on_a_first_attempt(client, make_body, corrector, request_paths):
    body = make_body()
    assert post(client, body) == corrector.expected(NBest(tuple(body["sentence_list"])))
    assert request_paths() == ["model"]


def test_inference_retry_gets_the_answer_already_computed(client, make_body, corrector, request_paths):
    first = post(client, make_body(retry=2))
    started = time.monotonic()
    for retry in (1, "1", 0):
        assert post(client, make_body(retry=retry)) == first
    assert time.monotonic() - started < 0.2
    assert corrector.calls == 1
    assert request_paths() == ["model", "retry_cached", "retry_cached", "retry_cached"]


@pytest.mark.parametrize("retry", [1, 0, "0"])
def test_inference_retry_never_seen_answers_top1_without_the_model(client, make_body, corrector,
                                                                     request_paths, retry):
    body = make_body(retry=retry)
    started = time.monotonic()
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert time.monotonic() - started < 0.1
    assert corrector.calls == 0
    assert request_paths() == ["retry_top1"]


def test_inference_answers_top1_when_top1_is_too_long(client, make_body, corrector, request_paths):
    body = make_body([LONG_TOP1, "我們"])
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert corrector.calls == 0
    assert request_paths() == ["too_long"]


@pytest.mark.parametrize("top1", ["e-mail while 5g", "<htr>", "5 . 0"])
def test_inference_answers_a_top1_without_han_characters_itself_on_a_path_of_its_own(
        client, make_body, corrector, request_paths, caplog, top1):
    """Nothing for the model to correct: TOP1 as it is, on the `no_han` path, logged and counted like every answer
    the model does not give, never as the model's."""
    body = make_body([top1, "喂 你好"])
    assert post(client, body) == top1_answer(body["sentence_list"]) == "".join(top1.split())
    assert corrector.calls == 0
    assert request_paths() == ["no_han"]
    [line] = [r for r in caplog.records if r.name == "api.requests"]
    assert line.levelname == "INFO"  # TOP1 by design, not a degraded answer
    assert "no Han character" in line.fields["reason"]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'esun_fallbacks_total{reason="no_han"} 1.0' in metrics
    assert 'esun_request_duration_seconds_count{path="no_han"} 1.0' in metrics
    assert 'esun_request_duration_seconds_count{path="model"} 0.0' in metrics


def test_inference_sends_top1_of_exactly_max_chars_to_the_model(client, make_body, corrector, config):
    body = make_body(["我 " * config.max_top1_chars])
    assert post(client, body).startswith(corrector.MARK)


def test_inference_first_attempt_already_answered_gets_the_cached_answer(client, make_body, corrector,
                                                                         request_paths):
    first = post(client, make_body())
    assert post(client, make_body()) == first
    assert corrector.calls == 1
    assert request_paths() == ["model", "cached"]


def test_inference_answers_top1_when_deadline_passes(make_app, fake_corrector, config, make_body, request_paths):
    slow = fake_corrector(delay_s=config.budget_s + 0.3)
    client = make_app(corrector=slow).test_client()
    body = make_body()
    started = time.monotonic()
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert time.monotonic() - started < config.budget_s + 0.15
    assert request_paths() == ["deadline"]

    # The late answer is kept for the judge's retry.
    cache = client.application.extensions[EXTENSION_KEY].cache
    wait_until(lambda: cache.get_local(cache_key(SimpleNamespace(**body))) is not None)
    assert post(client, make_body(retry=1)) == slow.expected(NBest(tuple(body["sentence_list"])))
    assert request_paths()[-1] == "retry_cached"


def test_a_question_whose_request_gave_up_before_its_batch_started_leaves_the_engines_count_at_once(
        make_app, fake_corrector, config, make_body, request_paths):
    gate = threading.Event()
    held = fake_corrector(gate=gate)
    # Two places on the model (pool_cap 2), batches of one: the first question's batch holds the model.
    app = make_app(config=dataclasses.replace(config, http_threads=4, max_batch_size=1), corrector=held)
    client = app.test_client()
    engine = app.extensions[EXTENSION_KEY].engine
    try:
        threading.Thread(target=post, args=(client, make_body(esun_uuid="a" * 64)), daemon=True).start()
        wait_until(lambda: engine.in_flight() == 1)
        post(client, make_body(esun_uuid="b" * 64))  # queued behind it until its deadline
        assert engine.in_flight() == 1  # cancelled as its request gave up, not left for the monitor's next look
        post(client, make_body(esun_uuid="c" * 64))  # so the next question still has a place
        assert request_paths()[-2:] == ["deadline", "deadline"]
        assert engine.stats().dropped_expired >= 1
    finally:
        gate.set()


def test_inference_answers_top1_at_once_when_overloaded(make_app, fake_corrector, config, make_body,
                                                        request_paths):
    gate = threading.Event()
    held = fake_corrector(gate=gate)
    # Two places on the model (pool_cap 2, batches of one): the first question's batch holds the model, the second
    # waits behind it; the third finds both places taken.
    app = make_app(config=dataclasses.replace(config, max_batch_size=1), corrector=held)
    client = app.test_client()
    engine = app.extensions[EXTENSION_KEY].engine
    try:
        post(client, make_body(esun_uuid="a" * 64))  # holds the model past its deadline
        threading.Thread(target=post, args=(client, make_body(esun_uuid="b" * 64)), daemon=True).start()
        wait_until(lambda: engine.in_flight() == 2)
        body = make_body(esun_uuid="c" * 64)
        started = time.monotonic()
        assert post(client, body) == top1_answer(body["sentence_list"])
        assert time.monotonic() - started < 0.1
        assert request_paths()[:2] == ["deadline", "overload"]
    finally:
        gate.set()


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param({"error": RuntimeError("CUDA out of memory")}, id="raises"),
        pytest.param({"answer": lambda item: ""}, id="empty-answer"),
        pytest.param({"answer": lambda item: None}, id="not-a-string"),
    ],
)
def test_inference_answers_top1_when_the_corrector_fails(make_app, fake_corrector, make_body, caplog,
                                                         request_paths, broken):
    client = make_app(corrector=fake_corrector(**broken)).test_client()
    body = make_body()
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]
    record = next(r for r in caplog.records if r.name == "api.requests")
    assert record.fields["esun_uuid"] == body["esun_uuid"]
    assert record.fields["reason"]
    # A failure is not remembered: the retry gets TOP1, not a broken answer.
    assert post(client, make_body(retry=1)) == top1_answer(body["sentence_list"])


def test_inference_answers_top1_when_the_corrector_returns_too_few_answers(make_app, fake_corrector,
                                                                          make_body, request_paths):
    class Short(fake_corrector):
        def predict_batch(self, items):
            return super().predict_batch(items)[1:]

    client = make_app(corrector=Short()).test_client()
    body = make_body()
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]


def test_inference_answers_top1_when_the_batcher_is_closed(app, client, make_body, request_paths):
    app.extensions[EXTENSION_KEY].engine.close()
    body = make_body()
    assert post(client, body) == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]


def test_inference_logs_one_line_per_request_with_latency_and_batch_size(client, make_body, caplog,
                                                                         request_paths):
    post(client, make_body())
    post(client, make_body(retry=1))
    records = [r for r in caplog.records if r.name == "api.requests"]
    assert len(records) == 2
    model, retry = (r.fields for r in records)
    assert model["path"] == "model" and model["batch_size"] == 1 and model["latency_ms"] >= 0
    assert retry["path"] == "retry_cached" and retry["batch_size"] is None
    assert {"esun_uuid", "retry", "path", "latency_ms", "batch_size"} <= set(model)


@pytest.mark.parametrize(
    "bad_answer",
    ["x" * 20_000, "\ud800", "改 waa", "", "  ", None, 123, "喂\x00你好", "答" * 1001],
    ids=["huge-latin", "lone-surrogate", "latin-inside", "empty", "blank", "none", "int", "control", "too-long"],
)
def test_inference_answers_top1_when_the_model_answer_is_unusable(make_app, fake_corrector, make_body,
                                                                  request_paths, bad_answer):
    client = make_app(corrector=fake_corrector(answer=lambda item: bad_answer)).test_client()
    body = make_body()
    response = client.post("/inference", json=body)
    assert response.status_code == 200
    assert response.get_json()["answer"] == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]
    # Nothing unusable was kept for the retry either.
    assert post(client, make_body(retry=1)) == top1_answer(body["sentence_list"])


def test_inference_never_gives_a_reused_uuid_the_answer_of_another_question(client, make_body, corrector,
                                                                            request_paths):
    first = post(client, make_body(esun_uuid="c" * 64, sentence_list=["喂 你好"]))
    second = post(client, make_body(esun_uuid="c" * 64, sentence_list=["今天 天氣 很 好"]))
    assert first != second
    assert second == corrector.expected(NBest(("今天 天氣 很 好",)))
    assert request_paths() == ["model", "model"]


def test_inference_answers_top1_when_a_rule_raises(make_app, make_body, request_paths, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("bug in a rule")

    app = make_app()
    monkeypatch.setattr(app.extensions[EXTENSION_KEY].cache, "get_local", broken)
    client = app.test_client()
    body = make_body()
    response = client.post("/inference", json=body)
    assert response.status_code == 200
    assert set(response.get_json()) == {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
    assert response.get_json()["answer"] == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]


@pytest.mark.parametrize(("judge_timeout_s", "path"), [(1.0, "deadline"), (2.0, "model")])
def test_inference_budget_follows_the_judge_timeout_setting(make_app, fake_corrector, config, make_body,
                                                            request_paths, judge_timeout_s, path):
    # The judge relaxed its timeout from 1 s to 2 s; a 1 s model answer is late for the first, in time for the second.
    settings = dataclasses.replace(config, judge_timeout_s=judge_timeout_s, safety_margin_s=0.5)
    client = make_app(config=settings, corrector=fake_corrector(delay_s=1.0)).test_client()
    body = make_body()
    started = time.monotonic()
    answer = post(client, body)
    assert time.monotonic() - started < judge_timeout_s
    assert request_paths() == [path]
    model_answer = fake_corrector.expected(NBest(tuple(body["sentence_list"])))
    assert answer == (top1_answer(body["sentence_list"]) if path == "deadline" else model_answer)


def test_inference_reads_a_body_that_starts_with_a_utf8_bom(client, make_body, request_paths):
    import json

    body = make_body()
    response = client.post("/inference", data=b"\xef\xbb\xbf" + json.dumps(body).encode("utf-8"))
    assert response.status_code == 200
    assert response.get_json()["esun_uuid"] == body["esun_uuid"]
    assert request_paths() == ["model"]

