"""POST /inference against the judge's contract (docs/contract.md), through the test client."""

from __future__ import annotations

import hashlib
import json

import pytest

from preprocess.text import NBest

RESPONSE_KEYS = {"esun_uuid", "server_uuid", "server_timestamp", "answer"}


def assert_contract_answer(response, body: dict, config) -> dict:
    """Check one answer against the contract and return its JSON."""
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert len(response.get_data(as_text=True)) < 10_240
    data = response.get_json()
    assert set(data) == RESPONSE_KEYS
    assert data["esun_uuid"] == body["esun_uuid"]
    assert isinstance(data["server_timestamp"], float)
    assert isinstance(data["answer"], str) and data["answer"]
    assert not any(ch.isspace() for ch in data["answer"])
    seed = config.captain_email + str(int(data["server_timestamp"])) + config.server_uuid_salt
    assert data["server_uuid"] == hashlib.sha256(seed.encode()).hexdigest()
    return data


def test_inference_answers_real_samples_per_contract(client, config, real_requests, corrector):
    for body in real_requests:
        data = assert_contract_answer(client.post("/inference", json=body), body, config)
        assert data["answer"] == corrector.expected(NBest(tuple(body["sentence_list"])))
    assert corrector.calls >= 1


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=utf-8"])
def test_inference_reads_body_whatever_the_content_type(client, config, make_body, content_type):
    body = make_body()
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/inference", data=json.dumps(body, ensure_ascii=False).encode(), headers=headers)
    assert_contract_answer(response, body, config)


@pytest.mark.parametrize("timestamp", [1590493849, 1656000000.5])
def test_inference_accepts_timestamp_as_int_or_float(client, config, make_body, timestamp):
    body = make_body(esun_timestamp=timestamp)
    assert_contract_answer(client.post("/inference", json=body), body, config)


def test_inference_ignores_unknown_keys(client, config, make_body):
    body = make_body(res_text=None, extra={"nested": [1, 2]})
    assert_contract_answer(client.post("/inference", json=body), body, config)


@pytest.mark.parametrize(
    "phonemes",
    [
        pytest.param(..., id="missing"),
        pytest.param(None, id="null"),
        pytest.param([], id="empty"),
        pytest.param(["w eI4"], id="shorter"),
        pytest.param(["w eI4"] * 14, id="longer"),
        pytest.param(["spn", "", "?? x_x 42", "喂"], id="odd-strings"),
        pytest.param([1, None], id="not-strings"),
        pytest.param("w eI4 n i:3", id="a-string"),
    ],
)
def test_inference_tolerates_any_phoneme_list(client, config, make_body, corrector, phonemes):
    body = make_body(phoneme_sequence_list=phonemes)
    if phonemes is ...:
        del body["phoneme_sequence_list"]
    data = assert_contract_answer(client.post("/inference", json=body), body, config)
    assert data["answer"].startswith(corrector.MARK)
    assert len(corrector.batches[-1][0].phonemes) <= config.max_hypotheses


def test_inference_drops_blank_later_hypotheses_before_the_corrector(client, config, make_body, corrector):
    """A blank hypothesis after TOP1 is accepted (200) and never reaches the corrector."""
    body = make_body(["喂 你好", "", "喂 您好", "   "])
    assert_contract_answer(client.post("/inference", json=body), body, config)
    assert corrector.batches[-1][0].sentences == ("喂 你好", "喂 您好")


def test_inference_passes_mixed_hypotheses_to_the_corrector_unchanged(client, config, make_body, corrector):
    sentences = ["喂 你好 密碼 waa 進去", "喂 你好 密碼 while 進去", "我 的 5g 手機 <htr> 壹貳參 e-mail ."]
    body = make_body(sentences)
    data = assert_contract_answer(client.post("/inference", json=body), body, config)
    assert corrector.batches[-1][0].sentences == tuple(sentences)
    assert data["answer"] == corrector.MARK + "喂你好密碼進去"


@pytest.mark.parametrize(
    ("top1", "expected"),
    [
        ("喂 你好 密碼 waa 進去", "喂你好密碼進去"),
        ("我 的 5g 手機 <htr> 壞 了 .", "我的手機壞了"),
        ("金額 壹萬 貳仟 參佰 元", "金額壹萬貳仟參佰元"),
        ("e-mail while 5g", "e-mailwhile5g"),  # no Han character at all: TOP1 without spaces, never empty
        ("<htr>", "<htr>"),
    ],
)
def test_inference_top1_answer_keeps_han_characters_only(client, config, make_body, top1, expected):
    body = make_body([top1, "喂 你好"], retry=0)  # a retry never seen: answered with TOP1 by the API
    data = assert_contract_answer(client.post("/inference", json=body), body, config)
    assert data["answer"] == expected


def test_inference_strips_spaces_from_model_answers(make_app, fake_corrector, config, make_body):
    client = make_app(corrector=fake_corrector(answer=lambda item: " 喂 你好 ")).test_client()
    body = make_body()
    data = assert_contract_answer(client.post("/inference", json=body), body, config)
    assert data["answer"] == "喂你好"
