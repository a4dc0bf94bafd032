"""Readable requests are answered (200), however odd their other fields: a 400 scores zero for the question,
while TOP1 is always a valid answer. Only a request without a usable question is refused
(tests/api/test_inference_bad_input.py); the rules are in the docstring of api/schemas.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from api.schemas import MAX_TOP1_KEPT_CHARS, MAX_UUID_CHARS
from preprocess.text import top1_answer
from tests.api.test_inference_contract import assert_contract_answer

RESPONSE_KEYS = {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
TOP1 = "喂 你好 密碼 我 要 進去"
SECOND = "喂 你好 密碼 哇 進去"


def post_raw(client, body: dict | bytes):
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return client.post("/inference", data=data)


def assert_answered(response, esun_uuid: str) -> str:
    """Check a 200 answer the judge can read (four keys, uuid echoed, a non-empty answer without spaces)."""
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    assert len(response.get_data(as_text=True)) < 10_240
    data = response.get_json()
    assert set(data) == RESPONSE_KEYS
    assert data["esun_uuid"] == esun_uuid
    assert data["answer"] and not any(ch.isspace() for ch in data["answer"])
    return data["answer"]


def raw_body(uuid: str = "raw-body", retry: str = "2", timestamp: str = "1590493849") -> bytes:
    """A request body written by hand, for numbers json.dumps cannot write (5,000-digit integers)."""
    return (f'{{"esun_uuid": "{uuid}", "esun_timestamp": {timestamp}, '
            f'"sentence_list": ["{TOP1}", "{SECOND}"], "retry": {retry}}}').encode()


@pytest.mark.parametrize(
    "later",
    [
        pytest.param(None, id="null"),
        pytest.param(3, id="number"),
        pytest.param(True, id="boolean"),
        pytest.param(["喂"], id="array"),
        pytest.param({"text": "喂"}, id="object"),
    ],
)
def test_inference_answers_when_a_later_hypothesis_is_not_a_string(client, make_body, corrector, later):
    body = make_body([TOP1, later, SECOND])
    answer = assert_answered(post_raw(client, body), body["esun_uuid"])
    assert answer.startswith(corrector.MARK)
    assert corrector.batches[-1][0].sentences == (TOP1, SECOND)


def test_inference_answers_when_a_later_hypothesis_is_null(client, make_body, corrector, request_paths):
    body = make_body([TOP1, None])
    assert assert_answered(post_raw(client, body), body["esun_uuid"]) == corrector.MARK + "喂你好密碼我要進去"
    assert corrector.batches[-1][0].sentences == (TOP1,)
    assert request_paths() == ["model"]


def test_inference_drops_a_later_hypothesis_longer_than_max_chars(client, make_body, corrector, config):
    too_long = "喂" * (config.max_chars_per_hypothesis + 1)
    just_fits = "好" * config.max_chars_per_hypothesis
    body = make_body([TOP1, too_long, just_fits])
    assert_answered(post_raw(client, body), body["esun_uuid"])
    assert corrector.batches[-1][0].sentences == (TOP1, just_fits)


@pytest.mark.parametrize("bad", ["喂\x00你好", "喂\x1b[31m", "喂\x85你好", "喂\x7f", "喂\ud800你好", "喂\udfff"])
def test_inference_drops_a_later_hypothesis_holding_control_characters(client, make_body, corrector, bad):
    body = make_body([TOP1, bad, SECOND])
    # ensure_ascii: a lone surrogate goes out as the JSON escape `\ud800`, as a sender could write it.
    response = client.post("/inference", data=json.dumps(body))
    assert_answered(response, body["esun_uuid"])
    assert corrector.batches[-1][0].sentences == (TOP1, SECOND)


@pytest.mark.parametrize(("top1", "read"), [
    ("喂\t你好 密碼", "喂 你好 密碼"), ("喂\r\n你好", "喂  你好"), ("喂\x00你好", "喂你好"),
    ("喂\x1b[31m 你好", "喂[31m 你好"),
    ("喂\x85你好", "喂 你好"), ("喂\x7f你好", "喂你好"), ("喂\ud800你好", "喂你好"), ("\udfff喂 你好", "喂 你好"),
], ids=["tab", "crlf", "nul", "escape", "c1-next-line", "delete", "lone-high-surrogate", "lone-low-surrogate"])
def test_inference_answers_a_top1_holding_control_characters_reading_it_without_them(
        client, make_body, corrector, top1, read):
    body = make_body([top1, SECOND])
    # ensure_ascii: a lone surrogate goes out as the JSON escape `\ud800`, as a sender could write it.
    answer = assert_answered(client.post("/inference", data=json.dumps(body)), body["esun_uuid"])
    assert corrector.batches[-1][0].sentences == (read, SECOND)
    assert answer == corrector.MARK + "".join(ch for ch in read if "\u4e00" <= ch <= "\u9fff")


def test_inference_drops_blank_later_hypotheses(client, make_body, corrector):
    body = make_body([TOP1, "", "   ", "\u3000", SECOND])
    assert_answered(post_raw(client, body), body["esun_uuid"])
    assert corrector.batches[-1][0].sentences == (TOP1, SECOND)


@pytest.mark.parametrize("top1", ["", "   ", "\u3000 "], ids=["empty", "blank", "unicode-blank"])
@pytest.mark.parametrize("retry", [2, 0], ids=["first-attempt", "last-attempt"])
def test_inference_answers_an_empty_or_blank_top1_with_the_empty_answer_without_the_model(
    client, make_body, corrector, request_paths, top1, retry
):
    """Regression: a blank TOP1 got a 400 (a failed attempt, retried twice, then scored nothing), while
    docs/contract.md allows an empty answer for exactly this TOP1. It is TOP1 without a Han character."""
    body = make_body([top1, SECOND], retry=retry)
    response = post_raw(client, body)
    assert response.status_code == 200
    assert response.get_json() | {"server_uuid": "", "server_timestamp": 0} == {
        "esun_uuid": body["esun_uuid"], "server_uuid": "", "server_timestamp": 0, "answer": ""}
    assert request_paths() == ["no_han" if retry == 2 else "retry_top1"]
    assert corrector.calls == 0


def test_inference_drops_hypotheses_past_ten(client, make_body, corrector, config):
    sentences = [TOP1] + [f"喂 {i}" for i in range(1, 15)]
    body = make_body(sentences)
    assert_answered(post_raw(client, body), body["esun_uuid"])
    assert config.max_hypotheses == 10
    assert corrector.batches[-1][0].sentences == tuple(sentences[:10])


def test_inference_drops_hypotheses_past_max_hypotheses_before_dropping_unusable_ones(
    make_app, config, make_body, corrector
):
    """The first max_hypotheses entries are read, then filtered: a dropped one is not replaced by a later one."""
    client = make_app(dataclasses.replace(config, max_hypotheses=3), corrector).test_client()
    body = make_body([TOP1, None, SECOND, "喂 您好"])
    assert_answered(post_raw(client, body), body["esun_uuid"])
    assert corrector.batches[-1][0].sentences == (TOP1, SECOND)


def test_inference_answers_top1_longer_than_max_chars_per_hypothesis_with_top1(
    client, make_body, corrector, config, request_paths
):
    """The too-long guard (more than max_top1_chars besides spaces) answers it at once, without the model."""
    top1 = "喂 " * (config.max_chars_per_hypothesis + 1)
    body = make_body([top1, SECOND])
    assert assert_answered(post_raw(client, body), body["esun_uuid"]) == "喂" * (config.max_chars_per_hypothesis + 1)
    assert request_paths() == ["too_long"]
    assert corrector.calls == 0


def test_inference_sends_a_long_top1_of_mostly_spaces_to_the_model(client, make_body, corrector, config):
    top1 = "喂" + " " * 20_000 + "好"
    body = make_body([top1, SECOND])
    assert assert_answered(post_raw(client, body), body["esun_uuid"]) == corrector.MARK + "喂好"
    assert corrector.batches[-1][0].sentences == (top1, SECOND)


@pytest.mark.parametrize(
    ("top1", "answer_char"),
    [
        pytest.param("喂" * 20_000, "喂", id="han"),
        pytest.param("喂 " * 15_000, "喂", id="han-with-spaces"),
        pytest.param('"' * 20_000, '"', id="quotes"),  # no Han: the answer is TOP1; a quote takes 2 in JSON
    ],
)
def test_inference_cuts_top1_past_max_top1_kept_chars_to_keep_the_response_readable(
    client, make_body, request_paths, top1, answer_char
):
    """A TOP1 of 15,000 characters or more (the judge sends nothing like it) would make a response the judge
    cuts at 10,240 characters and cannot parse; it is cut after MAX_TOP1_KEPT_CHARS characters besides
    whitespace and still answered."""
    uuid = '"' * MAX_UUID_CHARS
    body = make_body([top1, SECOND], esun_uuid=uuid)
    assert assert_answered(post_raw(client, body), uuid) == answer_char * MAX_TOP1_KEPT_CHARS
    assert request_paths() == ["too_long"]


@pytest.mark.parametrize(
    "timestamp",
    [
        pytest.param(..., id="missing"),
        pytest.param(None, id="null"),
        pytest.param("1590493849", id="numeric-string"),
        pytest.param("now", id="string"),
        pytest.param(False, id="boolean"),
        pytest.param({"s": 1}, id="object"),
        pytest.param(-1, id="negative"),
        pytest.param(10**300, id="huge"),
    ],
)
def test_inference_answers_whatever_the_timestamp(client, make_body, corrector, timestamp):
    body = make_body(esun_timestamp=timestamp)
    if timestamp is ...:
        del body["esun_timestamp"]
    answer = assert_answered(post_raw(client, body), body["esun_uuid"])
    assert answer.startswith(corrector.MARK)


def test_inference_answers_when_timestamp_is_missing(client, make_body, corrector, request_paths):
    body = make_body()
    del body["esun_timestamp"]
    assert assert_answered(post_raw(client, body), body["esun_uuid"]).startswith(corrector.MARK)
    assert request_paths() == ["model"]


@pytest.mark.parametrize("literal", ["1" + "0" * 309, "1" + "0" * 5000, "-" + "9" * 5000, "1e400", "NaN", "Infinity"])
def test_inference_answers_when_timestamp_is_too_large_for_a_float(client, corrector, literal):
    """Once a 400 (and a 500 before that, from an OverflowError); the field is never used."""
    answer = assert_answered(post_raw(client, raw_body(timestamp=literal)), "raw-body")
    assert answer.startswith(corrector.MARK)


def test_inference_reads_missing_retry_as_first_attempt(client, make_body, corrector, request_paths):
    body = make_body()
    del body["retry"]
    assert assert_answered(post_raw(client, body), body["esun_uuid"]).startswith(corrector.MARK)
    assert request_paths() == ["model"]


@pytest.mark.parametrize(
    "retry",
    [
        pytest.param(None, id="null"),
        pytest.param(3, id="3"),
        pytest.param(10**12, id="huge"),
        pytest.param(1.5, id="fraction"),
        pytest.param("two", id="word"),
        pytest.param("", id="empty-string"),
        pytest.param("7", id="string-out-of-range"),
        pytest.param(True, id="true"),
        pytest.param(False, id="false"),
        pytest.param([1], id="array"),
        pytest.param({"n": 1}, id="object"),
    ],
)
def test_inference_reads_unusable_retry_as_first_attempt(client, make_body, corrector, request_paths, retry):
    body = make_body(retry=retry)
    assert assert_answered(post_raw(client, body), body["esun_uuid"]).startswith(corrector.MARK)
    assert request_paths() == ["model"]
    assert corrector.calls == 1


@pytest.mark.parametrize("retry", [-1, "-1", -0.5, -(10**30)])
def test_inference_reads_negative_retry_as_last_attempt(client, make_body, corrector, request_paths, retry):
    """A negative retry is past the last attempt: answered at once, never queued for the model."""
    body = make_body(retry=retry)
    assert assert_answered(post_raw(client, body), body["esun_uuid"]) == top1_answer(body["sentence_list"])
    assert request_paths() == ["retry_top1"]
    assert corrector.calls == 0


@pytest.mark.parametrize(("literal", "path"), [("9" * 5000, "model"), ("-" + "9" * 5000, "retry_top1")])
def test_inference_answers_when_retry_is_an_integer_too_long_for_python(client, request_paths, literal, path):
    """Python refuses to read an int of over 4,300 digits; the body is valid JSON, so it is read as a float."""
    assert_answered(post_raw(client, raw_body(retry=literal)), "raw-body")
    assert request_paths() == [path]


@pytest.mark.parametrize(("retry", "path"), [(2, "model"), ("2", "model"), (" 2 ", "model"), (2.0, "model"),
                                             (1, "retry_top1"), ("1", "retry_top1"), (0, "retry_top1"),
                                             ("0", "retry_top1")])
def test_inference_reads_retry_as_int_or_numeric_string(client, config, make_body, corrector, request_paths, retry,
                                                         path):
    """The one test of numeric retries (it was also in test_inference_contract.py): a contract answer, by path."""
    body = make_body(retry=retry)
    data = assert_contract_answer(client.post("/inference", json=body), body, config)
    assert request_paths() == [path]
    if path == "model":
        assert data["answer"].startswith(corrector.MARK)


def test_inference_answers_the_barest_readable_request(client, corrector):
    """Only esun_uuid and a TOP1: no timestamp, retry or phones."""
    body = {"esun_uuid": "bare", "sentence_list": [TOP1]}
    assert assert_answered(post_raw(client, body), "bare") == corrector.MARK + "喂你好密碼我要進去"
