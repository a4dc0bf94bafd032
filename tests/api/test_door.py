"""The door (api/door.py): what gunicorn's event loop answers itself, before any thread, and what it leaves to one."""

from __future__ import annotations

import json
import logging
import time

import pytest

from api.door import Door
from api.guards import cache_key
from api.metrics import Metrics
from api.overload import OverloadControl
from api.schemas import parse_request
from cache.memory import MemoryResultCache
from config import Config
from testing.fakes import FakeClock

TOP1 = "喂你好密碼我要進去"
MAX_IN_FLIGHT = 8
INTERVAL_S = 0.1


def question(name: str = "q1", retry: int = 2) -> bytes:
    return json.dumps({"esun_uuid": name, "esun_timestamp": 1590493849, "retry": retry,
                       "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}).encode()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def control(clock: FakeClock) -> OverloadControl:
    return OverloadControl(MAX_IN_FLIGHT, 0.05, INTERVAL_S, 0.4, clock=clock)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def local() -> MemoryResultCache:
    return MemoryResultCache(max_entries=100, ttl_s=600)


@pytest.fixture
def door(control: OverloadControl, metrics: Metrics, local: MemoryResultCache) -> Door:
    return Door(Config(), control, metrics, local_cache=local)


def shed_everything(control: OverloadControl, clock: FakeClock) -> None:
    """Requests queue 300 ms before their view for three intervals: the control's limit falls to 0."""
    for _ in range(40):
        control.observe(0.3)
        clock.advance(INTERVAL_S / 4)
    assert control.state().limit == 0


def answered(body: bytes | None) -> dict:
    assert body is not None
    return json.loads(body)


def test_a_server_with_free_threads_and_no_overload_leaves_every_request_to_a_thread(door, metrics):
    assert door.answer(question(), accepted_at=0.0, pool_full=False) is None
    assert metrics.registry.get_sample_value("esun_request_duration_seconds_count", {"path": "pool_full"}) == 0


def test_with_every_thread_busy_a_question_is_answered_top1_in_the_judges_four_keys(door, metrics, caplog):
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(door.answer(question("busy"), accepted_at=0.0, pool_full=True))
    assert set(body) == {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
    assert (body["esun_uuid"], body["answer"]) == ("busy", TOP1)
    line = next(r for r in caplog.records if r.name == "api.requests")
    assert (line.fields["path"], line.fields["esun_uuid"]) == ("pool_full", "busy")
    assert "event loop" in line.fields["reason"]
    assert metrics.registry.get_sample_value("esun_request_duration_seconds_count", {"path": "pool_full"}) == 1
    assert metrics.registry.get_sample_value("esun_fallbacks_total", {"reason": "pool_full"}) == 1


def test_while_the_overload_control_sheds_model_work_new_questions_are_shed_at_the_door(door, control, clock):
    shed_everything(control, clock)
    before = control.state().shed_total
    body = answered(door.answer(question("shed"), accepted_at=clock.now, pool_full=False))
    assert body["answer"] == TOP1
    assert control.state().shed_total == before + 1


def test_under_a_reduced_share_the_door_sheds_only_what_the_model_limit_has_no_room_for(door, control, clock):
    for _ in range(12):  # three intervals of a standing queue: the limit halves
        control.observe(0.3)
        clock.advance(INTERVAL_S / 4)
    limit = control.state().limit
    assert 0 < limit < MAX_IN_FLIGHT
    assert door.answer(question(), accepted_at=clock.now, pool_full=False) is None  # room: a thread serves it
    for _ in range(limit):
        assert control.admit()  # the view admits that many to the model
    assert door.answer(question(), accepted_at=clock.now, pool_full=False) is not None


def test_with_max_in_flight_questions_on_the_model_the_door_answers_what_the_batcher_would_refuse(door, control,
                                                                                                 caplog):
    for _ in range(MAX_IN_FLIGHT):
        assert control.admit()
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(door.answer(question("full"), accepted_at=0.0, pool_full=False))
    assert body["answer"] == TOP1
    assert next(r for r in caplog.records if r.name == "api.requests").fields["path"] == "overload"
    assert control.state().shed_total == 0  # the batcher's bound, not a shed of the control
    control.release(0.1)
    assert door.answer(question("room"), accepted_at=0.0, pool_full=False) is None


def test_an_answer_this_replica_already_computed_is_given_at_the_door_instead_of_top1(door, local, caplog):
    local.put(cache_key(parse_request(question("known", retry=1), Config())), "喂你好密碼我要進去了")
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(door.answer(question("known", retry=1), accepted_at=0.0, pool_full=True))
    assert body["answer"] == "喂你好密碼我要進去了"
    assert next(r for r in caplog.records if r.name == "api.requests").fields["path"] == "retry_cached"


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", json.dumps({"esun_uuid": "x"}).encode()])
def test_an_unreadable_body_is_left_to_a_thread_so_the_view_gives_its_400(door, body):
    assert door.answer(body, accepted_at=0.0, pool_full=True) is None


def test_the_latency_of_a_door_answer_counts_from_the_accept_stamp(door, metrics):
    door.answer(question(), accepted_at=time.monotonic() - 0.3, pool_full=True)
    total = metrics.registry.get_sample_value("esun_request_duration_seconds_sum", {"path": "pool_full"})
    assert 0.3 <= total < 1.0


def test_a_retry_without_a_stored_answer_gets_top1_at_the_door_as_the_view_answers_every_retry(door, caplog):
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(door.answer(question("unknown", retry=0), accepted_at=0.0, pool_full=True))
    assert body["answer"] == TOP1
    assert next(r for r in caplog.records if r.name == "api.requests").fields["path"] == "retry_top1"
