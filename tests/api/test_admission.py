"""The admission (api/admission.py): its gates in order (pool at the door, late accept, the overload control's share of
the engine's one count of questions on the model); the overload control sheds model work while requests queue before
their view or on the model, recovers by itself, never sheds on a server that is not overloaded; its state in
/metrics, its changes in the log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from api.admission import NORMAL, RECOVERY_STEPS, REDUCED, SHEDDING, Admission
from api.app import create_app
from api.paths import AnswerPath
from api.state import EXTENSION_KEY
from config import Config, ConfigError
from tests.fakes import FakeClock, FaultCorrector

TARGET_S = 0.05
INTERVAL_S = 0.1
MODEL_TARGET_S = 0.4
POOL_CAP = 64
MIN_BUDGET_S = 0.1


class OnModel:
    """The engine's count of questions on the model (`Engine.in_flight`), as a test moves it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> int:
        return self.count


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def control(clock: FakeClock) -> Admission:
    return make(clock)


def make(clock: FakeClock, pool_cap: int = POOL_CAP, target_s: float = TARGET_S) -> Admission:
    return Admission(pool_cap, MIN_BUDGET_S, target_s, MODEL_TARGET_S, INTERVAL_S, on_model=OnModel(), clock=clock)


def on_model(control: Admission) -> OnModel:
    return control._on_model  # the fake count make() gave it


def take(control: Admission) -> AnswerPath | None:
    """A request with its whole budget ahead asks; admitted (None), its question is on the model until answered."""
    refusal = control.refusal(deadline=10.0, now=0.0)
    if refusal is None:
        on_model(control).count += 1
    return refusal


def answer(control: Admission, waited_s: float) -> None:
    """One question on the model is answered after waiting this long."""
    on_model(control).count -= 1
    control.observe_model_wait(waited_s)


def run_interval(control: Admission, clock: FakeClock, queued_s: list[float]) -> None:
    """Requests with these queued times arrive within one interval, which then ends."""
    for queued in queued_s:
        control.observe_queued(queued)
        clock.advance(INTERVAL_S / (len(queued_s) + 1))
    clock.advance(INTERVAL_S / (len(queued_s) + 1) + 1e-9)


def admitted(control: Admission, tries: int) -> int:
    """Count admissions out of `tries` requests that all keep their slot (none answered yet)."""
    return sum(take(control) is None for _ in range(tries))


def overload(control: Admission, clock: FakeClock, intervals: int) -> None:
    for _ in range(intervals):
        run_interval(control, clock, [0.2, 0.3, 0.25])


def test_a_server_without_a_standing_queue_admits_every_request(control, clock):
    # Bursts: most requests wait long, but one in each interval got its thread at once: no standing queue.
    for _ in range(50):
        run_interval(control, clock, [0.4, 0.002, 0.6, 0.3])
    assert control.state().level == NORMAL
    # No second bound: past pool_cap the engine refuses (path overload), not the admission.
    assert admitted(control, 2 * POOL_CAP) == 2 * POOL_CAP


def test_single_stalls_between_calm_intervals_never_shed(control, clock):
    # Every other interval, every request waited 300 ms (the process stalled), as 64 closed-loop clients see.
    for _ in range(30):
        run_interval(control, clock, [0.3, 0.35])
        run_interval(control, clock, [0.001, 0.3])
    assert control.state().limit == POOL_CAP
    assert admitted(control, POOL_CAP) == POOL_CAP


def test_queued_time_at_the_target_is_not_overload(control, clock):
    for _ in range(20):
        run_interval(control, clock, [TARGET_S, TARGET_S])
    assert control.state().limit == POOL_CAP


def test_a_standing_queue_halves_the_model_share_each_interval_down_to_shedding_everything(control, clock):
    limits = []
    for _ in range(9):
        overload(control, clock, 1)
        limits.append(control.state().limit)
    # The first interval over target may be a stall, not a queue: the share is halved from the second one on.
    assert limits == [64, 32, 16, 8, 4, 2, 1, 0, 0]
    assert control.state().level == SHEDDING
    assert take(control) is AnswerPath.SHED


def test_reduced_share_admits_up_to_the_limit_and_frees_slots_as_questions_are_answered(control, clock):
    overload(control, clock, 4)  # limit 8
    state = control.state()
    assert (state.level, state.limit) == (REDUCED, 8)
    assert admitted(control, 8) == 8
    assert [take(control) for _ in range(8)] == [AnswerPath.SHED] * 8
    answer(control, 0.2)
    assert take(control) is None
    assert take(control) is AnswerPath.SHED


def test_the_share_grows_back_step_by_step_once_the_queue_is_gone(control, clock):
    overload(control, clock, 10)
    assert control.state().limit == 0
    limits = []
    for _ in range(RECOVERY_STEPS):
        run_interval(control, clock, [0.001, 0.01])
        limits.append(control.state().limit)
    assert limits == sorted(limits) and limits[0] == POOL_CAP // RECOVERY_STEPS
    assert limits[-1] == POOL_CAP
    assert control.state().level == NORMAL


def test_an_idle_spell_counts_as_calm_intervals_so_the_first_request_after_a_lull_is_admitted(control, clock):
    overload(control, clock, 10)
    clock.advance(60.0)  # nobody came for a minute
    assert take(control) is None
    assert control.state().level == NORMAL


def test_a_short_lull_recovers_only_as_many_steps_as_intervals_passed(control, clock):
    overload(control, clock, 10)
    clock.advance(2.5 * INTERVAL_S)  # the last overloaded interval's end was passed already: two empty ones close
    assert control.state().limit == 2 * (POOL_CAP // RECOVERY_STEPS)


def test_a_target_of_zero_turns_the_control_off(clock):
    control = make(clock, pool_cap=4, target_s=0.0)
    overload(control, clock, 10)
    assert admitted(control, 6) == 6  # nothing is shed; the engine's bound refuses past 4
    state = control.state()
    assert (state.enabled, state.level, state.on_model) == (False, NORMAL, 6)


def test_each_change_of_level_is_logged_once_as_a_json_line(control, clock, caplog):
    with caplog.at_level(logging.INFO, logger="api.admission"):
        overload(control, clock, 10)  # normal -> reduced -> shedding
        for _ in range(RECOVERY_STEPS + 2):  # shedding -> reduced -> normal
            run_interval(control, clock, [0.0])
        control.state()
    changes = [(r.fields["overload_level_before"], r.fields["overload_level"]) for r in caplog.records
               if r.name == "api.admission"]
    assert changes == [("normal", "reduced"), ("reduced", "shedding"), ("shedding", "reduced"),
                       ("reduced", "normal")]
    shedding = next(r for r in caplog.records if r.fields["overload_level"] == "shedding")
    assert shedding.levelno == logging.WARNING
    assert shedding.fields["model_limit"] == 0 and shedding.fields["queued_min_ms"] == 200.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="interval_s"):
        Admission(2, MIN_BUDGET_S, TARGET_S, MODEL_TARGET_S, 0.0, on_model=OnModel())
    with pytest.raises(ValueError, match="target_s"):
        Admission(2, MIN_BUDGET_S, -1.0, MODEL_TARGET_S, INTERVAL_S, on_model=OnModel())
    with pytest.raises(ValueError, match="model_target_s"):
        Admission(2, MIN_BUDGET_S, TARGET_S, 0.0, INTERVAL_S, on_model=OnModel())
    with pytest.raises(ValueError, match="pool_cap"):
        Admission(0, MIN_BUDGET_S, TARGET_S, MODEL_TARGET_S, INTERVAL_S, on_model=OnModel())
    with pytest.raises(ConfigError, match="overload_target_s must be < budget_s"):
        Config(overload_target_s=0.75)


@pytest.mark.parametrize(("name", "successor"), [("POOL_LIMIT", "MAX_BATCH_SIZE"), ("MAX_IN_FLIGHT", "MAX_BATCH_SIZE"),
                                                 ("OVERLOAD_INTERVAL_S", "OVERLOAD_TARGET_S"),
                                                 ("OVERLOAD_MODEL_SHARE", "OVERLOAD_TARGET_S")])
def test_a_removed_setting_stops_the_start_in_one_line_naming_its_successor(name, successor):
    with pytest.raises(ConfigError, match=f"{name} was removed: .*{successor}"):
        Config.from_env({name: "1"})


def test_a_full_thread_pool_refuses_at_the_door_only(control):
    for _ in range(POOL_CAP):
        control.enter_pool()
    assert control.refusal(deadline=10.0, now=0.0, at_door=True) is AnswerPath.POOL_FULL
    assert control.refusal(deadline=10.0, now=0.0) is None  # a view's request is in the pool already
    control.leave_pool()
    assert control.refusal(deadline=10.0, now=0.0, at_door=True) is None


def test_a_request_with_less_than_a_batch_of_its_budget_left_is_refused_late(control):
    assert control.refusal(deadline=1.0, now=1.0 - MIN_BUDGET_S / 2) is AnswerPath.LATE_ACCEPT
    assert control.refusal(deadline=1.0, now=1.0 - 2 * MIN_BUDGET_S) is None


def test_the_count_of_questions_on_the_model_is_the_engines(clock):
    control = make(clock)
    on_model(control).count = 5
    assert control.state().on_model == 5


# --- Through the app: the view's path, /metrics, the request log


@pytest.fixture
def app(clock: FakeClock) -> Flask:
    def make_admission(on_model: Callable[[], int]) -> Admission:
        return Admission(8, MIN_BUDGET_S, TARGET_S, MODEL_TARGET_S, INTERVAL_S, on_model=on_model, clock=clock)

    app = create_app(Config(http_threads=16, max_batch_size=8), corrector=FaultCorrector(),
                     make_admission=make_admission)
    yield app
    app.extensions[EXTENSION_KEY].engine.close()


def ask(app: Flask, n: int) -> dict[str, Any]:
    body = {"esun_uuid": f"{n:064x}", "sentence_list": ["今天 天氣 很好", "今天 天器 很好"], "retry": 2}
    response = app.test_client().post("/inference", json=body)
    assert response.status_code == 200
    return response.get_json()


def logged_paths(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.fields["path"] for r in caplog.records if r.name == "api.requests"]


def test_shedding_answers_new_arrivals_top1_at_once_with_path_shed(app, clock, caplog):
    assert ask(app, 1)["answer"] == FaultCorrector.MARK + "今天天氣很好"
    overload(app.extensions[EXTENSION_KEY].admission, clock, 10)
    caplog.clear()
    assert ask(app, 2)["answer"] == "今天天氣很好"
    assert logged_paths(caplog) == ["shed"]


def test_a_server_answering_normally_never_sheds(app, clock, caplog):
    for n in range(30):
        ask(app, n)
        clock.advance(INTERVAL_S / 3)
    assert set(logged_paths(caplog)) == {"model"}


def test_metrics_expose_level_limit_signal_and_shed_count(app, clock):
    overload(app.extensions[EXTENSION_KEY].admission, clock, 10)
    ask(app, 3)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("esun_overload"))
    assert float(series["esun_overload_level"]) == SHEDDING
    assert float(series["esun_overload_model_limit"]) == 0
    assert float(series["esun_overload_shed_total"]) == 1
    assert float(series["esun_overload_queued_min_seconds"]) == pytest.approx(0.2)
    assert float(series["esun_overload_model_wait_min_seconds"]) == 0.0  # no model answer in the last interval
    assert 'esun_fallbacks_total{reason="shed"} 1.0' in text


def model_interval(control: Admission, clock: FakeClock, waits_s: list[float]) -> None:
    """Requests admitted earlier are answered within one interval after waiting this long on the model."""
    for wait in waits_s:
        assert take(control) is None
        answer(control, wait)
    clock.advance(INTERVAL_S + 1e-9)


def test_model_answers_slower_than_the_target_for_two_intervals_shrink_the_share_and_fast_ones_restore_it(
        control, clock):
    limits = []
    for _ in range(3):
        model_interval(control, clock, [0.5, 0.7, 0.75])  # even the quickest answer took 500 ms
        limits.append(control.state().limit)
    assert limits == [64, 32, 16]
    for _ in range(RECOVERY_STEPS):
        model_interval(control, clock, [0.15, 0.6])
    assert control.state().limit == POOL_CAP
    assert control.state().model_wait_min_s == pytest.approx(0.15)


def test_a_model_that_answers_within_its_target_keeps_the_full_share_whatever_the_slowest_answers(control, clock):
    for _ in range(50):
        model_interval(control, clock, [0.2, 0.74, 0.75, 0.75])  # batches of 64: the first within target
    assert control.state().limit == POOL_CAP


def test_the_app_counts_questions_on_the_model_with_its_engine(app):
    state = app.extensions[EXTENSION_KEY]
    assert state.admission.state().on_model == state.engine.in_flight() == 0
    assert state.engine.describe()["max_in_flight"] == state.config.pool_cap


def test_the_readme_checks_table_names_the_admission_checks_the_code_has():
    import re

    import api.admission
    from config import REPO_ROOT

    def paths_of(text: str, heading: str) -> list[str]:
        table = text[text.index(heading):].split("\n\n")[0]
        return re.findall(r"^\| [^|]+ \| [^|]+ \| `(\w+)` \|", table, flags=re.M)

    readme = paths_of((REPO_ROOT / "README.md").read_text(encoding="utf-8"), "| check | acts when |")
    in_code = paths_of(api.admission.__doc__, "| check | refuses when |")
    assert readme == [*in_code, AnswerPath.OVERLOAD.value] == ["pool_full", "late_accept", "shed", "overload"]
