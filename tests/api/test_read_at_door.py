"""The event loop's quick read of a request (api.schemas.read_at_door): whatever it reads, parse_request reads alike
(esun_uuid, retry, TOP1); whatever parse_request refuses or reads otherwise, it leaves to a thread (None)."""

from __future__ import annotations

import json

import pytest

from api.errors import InvalidRequest
from api.schemas import MAX_TOP1_KEPT_CHARS, MAX_UUID_CHARS, parse_request, read_at_door
from config import Config

TOP1 = "喂 你好 密碼 我 要 進去"
SECOND = "喂 你好 密碼 哇 進去"
CANONICAL = {"esun_uuid": "q1", "esun_timestamp": 1590493849, "sentence_list": [TOP1, SECOND],
             "phoneme_sequence_list": ["a b", "c d"], "retry": 2}


def variant(**fields: object) -> bytes:
    body = dict(CANONICAL)
    for name, value in fields.items():
        if value is _MISSING:
            body.pop(name)
        else:
            body[name] = value
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "backslashreplace")


_MISSING = object()
ODD_VALUES = [None, True, 0, -3, 1.0, 2.5, "1", " 0 ", "x", "", [], {}, [TOP1], "\x00", "a\ud800", " ", "\u3000",
              "a" * (MAX_UUID_CHARS + 1), "a" * MAX_UUID_CHARS, _MISSING]
HYPOTHESES = [[], [None], [""], ["  "], ["a\x00b"], ["a\x85b"], [3, TOP1], [TOP1, None], [TOP1, 3, {"a": 1}],
              ["喂" * (MAX_TOP1_KEPT_CHARS + 10)], [" 喂 " * (MAX_TOP1_KEPT_CHARS + 10)], [TOP1] * 30, TOP1,
              {"0": TOP1}, ["a\ud800"], ["\u3000"], [TOP1, "b\x00"]]
BODIES = (
    [variant()]
    + [variant(**{name: value}) for name in ("esun_uuid", "retry", "esun_timestamp", "phoneme_sequence_list")
       for value in ODD_VALUES]
    + [variant(sentence_list=value) for value in [*HYPOTHESES, *ODD_VALUES]]
    + [variant(retry=value) for value in (1, 0, 2, 3, -1, 1e308, "2.0", float("nan"))]
    + [b"\xef\xbb\xbf" + variant(), variant() + b"  \n", b"[]", b"null", b"\"q\"", b"{", b"\xff\xfe{}", b"",
       variant().replace(b'"retry": 2', b'"retry": ' + b"9" * 5000),
       variant().replace(b'"retry": 2', b'"retry": 1, "retry": 0'),
       variant().replace(b'"esun_uuid": "q1"', b'"esun_uuid": "\\ud800"'),
       variant().replace(TOP1.encode(), b"\\udc00\\u55ae"), b"[" * 100_000 + b"]" * 100_000]
)


def full_read(body: bytes) -> tuple[str, int, str] | None:
    try:
        req = parse_request(body, Config())
    except InvalidRequest:
        return None
    return req.esun_uuid, req.retry, req.sentence_list[0]


@pytest.mark.parametrize("body", BODIES, ids=[f"body{i}" for i in range(len(BODIES))])
def test_what_the_door_reads_the_view_reads_alike_and_what_the_view_refuses_the_door_leaves(body):
    quick = read_at_door(body)
    if quick is not None:
        assert (quick.esun_uuid, quick.retry, quick.sentence_list[0]) == full_read(body)


def test_the_judges_own_requests_are_read_at_the_door():
    read = [read_at_door(variant(retry=retry)) for retry in (2, 1, 0)]
    assert [(r.esun_uuid, r.retry, r.sentence_list) for r in read if r] == [("q1", n, (TOP1,)) for n in (2, 1, 0)]


def test_a_request_the_view_refuses_is_never_read_at_the_door():
    refused = [body for body in BODIES if full_read(body) is None]
    assert len(refused) > 20  # the corpus holds refusals of every kind
    assert [body[:60] for body in refused if read_at_door(body) is not None] == []
