"""The answer policy at the event loop (api.answers.AnswerPolicy.at_door): what gunicorn's event loop answers
itself, before any thread, and what it leaves to one; the same answer the view would give."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest
from flask import Flask

from api.admission import Admission
from api.answers import cache_key
from api.app import create_app
from api.schemas import parse_request
from api.state import EXTENSION_KEY, AppState
from batching import Overloaded
from config import Config
from tests.fakes import FakeClock, FaultCorrector

TOP1 = "喂你好密碼我要進去"
POOL_CAP = 4
INTERVAL_S = 0.1


def question(name: str = "q1", retry: int = 2) -> bytes:
    return json.dumps({"esun_uuid": name, "esun_timestamp": 1590493849, "retry": retry,
                       "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]}).encode()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class OnModel:
    """The engine's count of questions on the model, unless a test sets `fixed`."""

    def __init__(self) -> None:
        self.engine: Callable[[], int] = lambda: 0
        self.fixed: int | None = None

    def __call__(self) -> int:
        return self.engine() if self.fixed is None else self.fixed


@pytest.fixture
def on_model() -> OnModel:
    return OnModel()


@pytest.fixture
def app(clock: FakeClock, on_model: OnModel) -> Iterator[Flask]:
    def make_admission(engine_count: Callable[[], int]) -> Admission:
        on_model.engine = engine_count
        return Admission(POOL_CAP, 0.1, 0.05, 0.4, INTERVAL_S, on_model=on_model, clock=clock)

    app = create_app(Config(http_threads=2 * POOL_CAP, max_batch_size=POOL_CAP), corrector=FaultCorrector(),
                     make_admission=make_admission)
    yield app
    app.extensions[EXTENSION_KEY].engine.close()


@pytest.fixture
def admission(app: Flask) -> Admission:
    return app.extensions[EXTENSION_KEY].admission


@pytest.fixture
def state(app: Flask) -> AppState:
    return app.extensions[EXTENSION_KEY]


def at_door(state: AppState, body: bytes, waited_s: float = 0.0) -> bytes | None:
    return state.answers.at_door(body, accepted_at=time.monotonic() - waited_s)


def fill_pool(admission: Admission) -> None:
    for _ in range(POOL_CAP):
        admission.enter_pool()


def shed_everything(admission: Admission, clock: FakeClock) -> None:
    """Requests queue 300 ms before their view for three intervals: the control's limit falls to 0."""
    for _ in range(40):
        admission.observe_queued(0.3)
        clock.advance(INTERVAL_S / 4)
    assert admission.state().limit == 0


def answered(body: bytes | None) -> dict:
    assert body is not None
    return json.loads(body)


def paths_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.fields["path"] for r in caplog.records if r.name == "api.requests"]


def requests_by_path(state: AppState, path: str) -> float | None:
    return state.metrics.registry.get_sample_value("esun_request_duration_seconds_count", {"path": path})


def test_a_server_with_free_threads_and_no_overload_leaves_every_request_to_a_thread(state):
    assert at_door(state, question()) is None
    assert requests_by_path(state, "pool_full") == 0


def test_with_the_pool_full_a_question_is_answered_top1_in_the_judges_four_keys(state, admission, caplog):
    fill_pool(admission)
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(at_door(state, question("busy")))
    assert set(body) == {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
    assert (body["esun_uuid"], body["answer"]) == ("busy", TOP1)
    line = next(r for r in caplog.records if r.name == "api.requests")
    assert (line.fields["path"], line.fields["esun_uuid"]) == ("pool_full", "busy")
    assert "event loop" in line.fields["reason"]
    assert requests_by_path(state, "pool_full") == 1
    assert state.metrics.registry.get_sample_value("esun_fallbacks_total", {"reason": "pool_full"}) == 1


def test_while_the_overload_control_sheds_model_work_new_questions_are_shed_at_the_door(state, admission, clock,
                                                                                      caplog):
    shed_everything(admission, clock)
    with caplog.at_level(logging.INFO, logger="api.requests"):
        assert answered(at_door(state, question("shed")))["answer"] == TOP1
    assert paths_logged(caplog) == ["shed"]
    assert state.metrics.answered()["shed"] == 1


def test_under_a_reduced_share_the_door_sheds_only_what_the_model_limit_has_no_room_for(state, admission, clock,
                                                                                        on_model):
    for _ in range(12):  # three intervals of a standing queue: the limit halves
        admission.observe_queued(0.3)
        clock.advance(INTERVAL_S / 4)
    limit = admission.state().limit
    assert 0 < limit < POOL_CAP
    assert at_door(state, question()) is None  # room: a thread serves it
    on_model.fixed = limit  # the engine holds as many questions as the share allows
    assert answered(at_door(state, question()))["answer"] == TOP1


def test_with_the_engine_full_the_door_leaves_the_question_to_a_thread_which_hears_the_engines_refusal(
        app, state, admission, on_model, caplog):
    on_model.fixed = POOL_CAP  # questions whose requests gave up, not yet expired by the engine
    assert at_door(state, question("full")) is None  # the admission keeps no bound of its own
    with caplog.at_level(logging.INFO, logger="api.requests"):
        state.engine.submit = _refuse  # the engine's bound
        response = app.test_client().post("/inference", data=question("full"))
    assert response.get_json()["answer"] == TOP1
    assert paths_logged(caplog) == ["overload"]
    assert state.metrics.answered()["shed"] == 0


def _refuse(*_args: object) -> None:
    raise Overloaded(f"{POOL_CAP} items in flight, max_in_flight is {POOL_CAP}")


def test_an_answer_this_replica_already_computed_is_given_at_the_door_instead_of_top1(state, admission, caplog):
    state.cache.put(cache_key(parse_request(question("known", retry=1), Config())), "喂你好密碼我要進去了")
    fill_pool(admission)
    with caplog.at_level(logging.INFO, logger="api.requests"):
        body = answered(at_door(state, question("known", retry=1)))
    assert body["answer"] == "喂你好密碼我要進去了"
    assert paths_logged(caplog) == ["retry_cached"]


def test_the_door_and_the_view_give_a_question_the_same_answer_and_path(app, state, admission, caplog):
    """Rule by rule: a retry, a too-long TOP1, a first attempt answered already."""
    long_top1 = json.dumps({"esun_uuid": "long", "sentence_list": ["長" * 60]}).encode()
    state.cache.put(cache_key(parse_request(question("seen"), Config())), "喂你好密碼我要進去了")
    bodies = [question("unseen", retry=0), long_top1, question("seen")]
    with caplog.at_level(logging.INFO, logger="api.requests"):
        views = [app.test_client().post("/inference", data=body).get_json()["answer"] for body in bodies]
        fill_pool(admission)
        doors = [answered(at_door(state, body))["answer"] for body in bodies]
    assert doors == views
    paths = paths_logged(caplog)
    assert paths[:3] == paths[3:] == ["retry_top1", "too_long", "cached"]


def test_a_retry_the_local_cache_lacks_is_left_to_a_thread_when_answers_are_shared(state, admission):
    state.cache.shared = object()  # a shared level the event loop must not call (the view reads it)
    fill_pool(admission)
    assert at_door(state, question("elsewhere", retry=1)) is None
    assert at_door(state, question("first")) is not None  # first attempts read the local level at either door


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", json.dumps({"esun_uuid": "x"}).encode()])
def test_an_unreadable_body_is_left_to_a_thread_so_the_view_gives_its_400(state, admission, body):
    fill_pool(admission)
    assert at_door(state, body) is None


def test_the_latency_of_a_door_answer_counts_from_the_accept_stamp(state, admission):
    fill_pool(admission)
    at_door(state, question(), waited_s=0.3)
    total = state.metrics.registry.get_sample_value("esun_request_duration_seconds_sum", {"path": "pool_full"})
    assert 0.3 <= total < 1.0


def test_a_request_whose_budget_is_nearly_spent_is_answered_late_accept_at_the_door(state, caplog):
    with caplog.at_level(logging.INFO, logger="api.requests"):
        assert answered(at_door(state, question(), waited_s=0.7))["answer"] == TOP1
    assert paths_logged(caplog) == ["late_accept"]
