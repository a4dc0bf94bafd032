"""Requests the service cannot read get a JSON 400/413 naming the problem, never HTML or a traceback.

Only a request without a usable question is refused: a body that is not a JSON object, no esun_uuid that can be
echoed, no sentence_list, or no usable TOP1. Readable requests with odd fields are answered
(tests/api/test_inference_lenient_input.py)."""

from __future__ import annotations

import json

import pytest


def assert_json_error(response, status: int, error: str, detail_part: str = "") -> None:
    assert response.status_code == status
    assert response.mimetype == "application/json"
    data = response.get_json()
    assert set(data) == {"error", "detail"}
    assert data["error"] == error
    assert detail_part in data["detail"]
    assert "Traceback" not in response.get_data(as_text=True)


@pytest.mark.parametrize(
    ("raw", "detail_part"),
    [
        pytest.param(b"", "not valid JSON", id="empty-body"),
        pytest.param(b'{"esun_uuid": "x",', "not valid JSON", id="truncated-json"),
        pytest.param(b"\xff\xfe{}", "not valid UTF-8", id="invalid-utf8"),
        pytest.param(b'{"esun_uuid": "\xc3\x28"}', "not valid UTF-8", id="invalid-utf8-inside-string"),
        pytest.param(b"[]", "must be a JSON object, got an array", id="array"),
        pytest.param(b'"text"', "must be a JSON object, got a string", id="string"),
        pytest.param(b"null", "must be a JSON object, got null", id="null"),
        pytest.param(b"[" * 30_000 + b"]" * 30_000, "not readable JSON", id="nested-too-deep"),
        pytest.param(b'{"retry": ' + b"9" * 5000 + b"}", "esun_uuid: Field required", id="only-a-long-integer"),
    ],
)
def test_inference_rejects_unreadable_bodies(client, raw, detail_part):
    assert_json_error(client.post("/inference", data=raw), 400, "bad_request", detail_part)


def _without(field):
    return lambda body: body.pop(field)


def _set(field, value):
    return lambda body: body.__setitem__(field, value)


@pytest.mark.parametrize(
    ("change", "detail_part"),
    [
        pytest.param(_without("esun_uuid"), "esun_uuid: Field required", id="missing-uuid"),
        pytest.param(_set("esun_uuid", 42), "esun_uuid", id="uuid-not-string"),
        pytest.param(_set("esun_uuid", None), "esun_uuid", id="uuid-null"),
        pytest.param(_set("esun_uuid", ""), "esun_uuid", id="uuid-empty"),
        pytest.param(_set("esun_uuid", "a" * 257), "esun_uuid", id="uuid-too-long"),
        pytest.param(_set("esun_uuid", "abc\ndef"), "esun_uuid: must not hold control characters",
                     id="uuid-control-char"),
        pytest.param(_set("esun_uuid", "abc\ud800"), "esun_uuid: Input should be a valid string",
                     id="uuid-lone-surrogate"),
        pytest.param(_without("sentence_list"), "sentence_list: Field required", id="missing-sentences"),
        pytest.param(_set("sentence_list", "喂 你好"), "sentence_list", id="sentences-not-list"),
        pytest.param(_set("sentence_list", None), "sentence_list", id="sentences-null"),
        pytest.param(_set("sentence_list", {"0": "喂 你好"}), "sentence_list", id="sentences-object"),
        pytest.param(_set("sentence_list", []), "sentence_list: must hold at least one hypothesis (TOP1)",
                     id="sentences-empty"),
        pytest.param(_set("sentence_list", [None, "喂 你好"]), "TOP1) must be a string, got null", id="top1-null"),
        pytest.param(_set("sentence_list", [3, "喂 你好"]), "TOP1) must be a string, got a number",
                     id="top1-number"),
        pytest.param(_set("sentence_list", [["喂"], "喂 你好"]), "TOP1) must be a string, got an array",
                     id="top1-array"),
    ],
)
def test_inference_rejects_invalid_fields_naming_them(client, make_body, corrector, change, detail_part):
    body = make_body()
    change(body)
    response = client.post("/inference", data=json.dumps(body))
    assert_json_error(response, 400, "bad_request", detail_part)
    assert corrector.calls == 0


def test_inference_rejects_body_over_max_body_bytes(client, make_body, config):
    body = make_body(padding="x" * config.max_body_bytes)
    assert_json_error(client.post("/inference", json=body), 413, "payload_too_large")


def test_inference_logs_rejected_requests_with_their_uuid(client, make_body, caplog):
    client.post("/inference", json=make_body(sentence_list=[]))
    record = next(r for r in caplog.records if r.name == "api.errors")
    assert record.fields["status"] == 400
    assert record.fields["esun_uuid"] == make_body()["esun_uuid"]
