"""Fault injection over real HTTP: the batch function raises, hangs past the deadline, or kills its worker thread.

In each case every request is answered 200 within the judge's timeout (TOP1 for the questions the fault hit),
the batcher recovers by itself (later questions get model answers), /readyz says what the batcher reports, and
the JSON log says why each TOP1 was given.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import batching.core
from api.state import EXTENSION_KEY
from config import Config
from preprocess.text import han_chars
from tests.fakes import FaultCorrector, Hang, KillWorker, Raise, WorkerKilled
from tests.faults.judge import Answer, CountingBatcher, JudgeClient, question, request_lines, top1_of, wait_until

pytestmark = pytest.mark.live

NOT_RUNNING = {"ready": False, "reasons": ["batcher worker is not running"]}
READY = {"ready": True, "reasons": []}


def burst(client: JudgeClient, bodies: list[dict[str, Any]]) -> list[Answer]:
    """Send the questions at once, as the judge's concurrent senders do."""
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(client.post, bodies))


def assert_answered_in_time(answers: list[Answer], timeout_s: float) -> None:
    assert all(a.status == 200 for a in answers), [a.data for a in answers if a.status != 200]
    assert all(set(a.data) == {"esun_uuid", "server_uuid", "server_timestamp", "answer"} for a in answers)
    slowest = max(a.elapsed_s for a in answers)
    assert slowest < timeout_s, f"slowest answer took {slowest:.3f} s"


def assert_model_answers(answers: list[Answer]) -> None:
    assert [a.answer for a in answers] == [FaultCorrector.MARK + top1_of(a.body) for a in answers]


def hit_by_fault(corrector: FaultCorrector) -> set[str]:
    """Return the TOP1 answers of the questions in the batches a fault hit."""
    return {han_chars(item.top1) for item in corrector.faulted_items}


def test_inference_answers_top1_when_batch_function_raises(
    serve: Callable[..., Any], fault_corrector: FaultCorrector, fault_config: Config,
    judge: Callable[[str], JudgeClient], json_log: Callable[[], list[dict[str, Any]]],
) -> None:
    app, base = serve(fault_corrector)
    client = judge(base)
    fault_corrector.arm(Raise(RuntimeError("fault injected: CUDA error: out of memory")),
                        Raise(ValueError("fault injected: bad tensor shape")))

    answers = burst(client, [question(i) for i in range(12)])

    assert_answered_in_time(answers, fault_config.judge_timeout_s)
    assert fault_corrector.armed == 0, "fewer batches than faults: the burst did not exercise them"
    hit = hit_by_fault(fault_corrector)
    logged = request_lines(json_log())
    for a in answers:
        line = logged[a.body["esun_uuid"]]
        if top1_of(a.body) in hit:
            assert a.answer == top1_of(a.body)
            assert line["path"] == "error"
            assert "fault injected" in line["reason"] and "BatchFailed" in line["reason"]
            assert line["level"] == "WARNING"
        else:
            assert a.answer == FaultCorrector.MARK + top1_of(a.body)
            assert line["path"] == "model"
    assert sum(1 for line in json_log() if line["logger"] == "batching.threaded" and "failed" in line["msg"]) == 2

    # Recovered at once: the worker never stopped, later questions get the model, /readyz never wavered.
    assert_model_answers([client.post(question(i)) for i in range(100, 104)])
    assert client.ready() == (200, READY)
    stats = app.extensions[EXTENSION_KEY].engine.stats()
    assert (stats.failures, stats.restarts, stats.worker_alive) == (2, 0, True)


STUCK_AFTER_S = 0.3
HANG_S = 2.5


def _is_stuck(ready: tuple[int, dict[str, Any]]) -> bool:
    status, body = ready
    return status == 503 and len(body["reasons"]) == 1 and body["reasons"][0].startswith("a batch has been running")


def test_inference_answers_top1_while_a_batch_hangs_past_the_deadline(
    serve: Callable[..., Any], fault_corrector: FaultCorrector, fault_config: Config,
    judge: Callable[[str], JudgeClient], json_log: Callable[[], list[dict[str, Any]]],
) -> None:
    # batch_stuck_after_s (Config) decides when /readyz calls a running batch stuck; short here so the test sees it.
    app, base = serve(fault_corrector, config=dataclasses.replace(fault_config, batch_stuck_after_s=STUCK_AFTER_S))
    client = judge(base)
    fault_corrector.arm(Hang(HANG_S))

    first = client.post(question(0))
    assert fault_corrector.hanging.is_set()
    # /readyz tells a hung batch once it has run past stuck_after_s (the first answer took the 0.5 s budget).
    wait_until(lambda: _is_stuck(client.ready()), timeout_s=1.0)
    during = burst(client, [question(i) for i in range(1, 9)])
    assert fault_corrector.hanging.is_set(), "the hang ended before the burst: the test proves nothing"

    answers = [first, *during]
    assert_answered_in_time(answers, fault_config.judge_timeout_s)
    assert [a.answer for a in answers] == [top1_of(a.body) for a in answers]
    logged = request_lines(json_log())
    for a in answers:
        line = logged[a.body["esun_uuid"]]
        assert (line["path"], line["reason"], line["level"]) == ("deadline", "no answer within budget", "INFO")
    # (their WARNING is summed, one a second: api.logs.OverloadSums, tests/api/test_logs.py)

    # The hang ends by itself: the worker takes the queue again, late questions are gone, not run.
    wait_until(lambda: not fault_corrector.hanging.is_set(), timeout_s=HANG_S + 1)
    wait_until(lambda: client.ready() == (200, READY), timeout_s=1.0)
    assert_model_answers([client.post(question(i)) for i in range(100, 104)])
    ran_after_hang = {han_chars(item.top1) for batch in fault_corrector.batches[1:] for item in batch}
    assert not ran_after_hang & {top1_of(a.body) for a in during}, "questions nobody waited for were run"
    # The hung batch's late answer was kept for the judge's retry of that question.
    retry = client.post({**first.body, "retry": 1})
    assert retry.answer == FaultCorrector.MARK + top1_of(first.body)
    stats = app.extensions[EXTENSION_KEY].engine.stats()
    assert stats.in_flight == 0 and stats.dropped_expired >= len(during)


def readyz_until_restarted(client: JudgeClient, batcher: CountingBatcher, restarts: int,
                           timeout_s: float = 2.0) -> list[tuple[int, dict[str, Any]]]:
    """Poll /readyz (only: a new question would itself restart the worker) until the worker is back."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(client.ready())
        if seen[-1] == (200, READY) and batcher.stats().restarts == restarts:
            return seen
        time.sleep(0.005)
    raise AssertionError(f"the worker was not back within {timeout_s} s: {seen[-3:]}")


@pytest.mark.parametrize("exc_type", [WorkerKilled, SystemExit, KeyboardInterrupt])
def test_inference_answers_top1_when_worker_thread_dies_and_batcher_replaces_it(
    serve: Callable[..., Any], fault_corrector: FaultCorrector, fault_config: Config,
    judge: Callable[[str], JudgeClient], json_log: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch, exc_type: type[BaseException],
) -> None:
    # The monitor replaces a dead worker within one poll (50 ms). A slower poll widens that gap so that a
    # client can be seen reading /readyz in it; the view never waits on the poll, so answers are unaffected.
    monkeypatch.setattr(batching.core, "POLL_S", 0.5)
    app, base = serve(fault_corrector)
    batcher = app.extensions[EXTENSION_KEY].engine
    client = judge(base)
    assert_model_answers([client.post(question(0))])

    saw_dead = False
    killed = 0
    while not saw_dead and killed < 3:  # the gap is random in [0, 0.5 s]: rarely too short to be seen
        fault_corrector.arm(KillWorker(exc_type))
        victim = client.post(question(10 + killed))
        killed += 1
        assert victim.status == 200 and victim.answer == top1_of(victim.body)
        line = request_lines(json_log())[victim.body["esun_uuid"]]
        assert line["path"] == "error" and exc_type.__name__ in line["reason"]
        saw_dead = (503, NOT_RUNNING) in readyz_until_restarted(client, batcher, restarts=killed)
    assert saw_dead, "/readyz never reported the dead worker"

    assert_model_answers([client.post(question(i)) for i in range(100, 104)])
    stats = batcher.stats()
    assert (stats.restarts, stats.worker_alive, stats.in_flight) == (killed, True, 0)
    lines = json_log()
    died = [line for line in lines if line["msg"] == "batch worker died"]
    assert len(died) == killed and exc_type.__name__ in died[0]["exc"] and died[0]["level"] == "ERROR"
    assert sum(1 for line in lines if line["msg"].startswith("batch worker thread was dead; restarted")) == killed


def test_inference_answers_every_question_when_worker_dies_mid_burst(
    serve: Callable[..., Any], fault_corrector: FaultCorrector, fault_config: Config,
    judge: Callable[[str], JudgeClient], json_log: Callable[[], list[dict[str, Any]]],
) -> None:
    fault_corrector.delay_s = 0.02  # so that questions gather behind the batch that kills the worker
    app, base = serve(fault_corrector)
    client = judge(base)
    fault_corrector.arm(KillWorker())

    answers = burst(client, [question(i) for i in range(16)])

    assert_answered_in_time(answers, fault_config.judge_timeout_s)
    hit = hit_by_fault(fault_corrector)
    logged = request_lines(json_log())
    for a in answers:
        line = logged[a.body["esun_uuid"]]
        if line["path"] == "model":
            assert top1_of(a.body) not in hit
            assert a.answer == FaultCorrector.MARK + top1_of(a.body)
        else:
            # In the fatal batch, or taken off the queue by the worker that died: TOP1 and the reason.
            assert a.answer == top1_of(a.body)
            assert line["path"] == "error"
            assert "WorkerKilled" in line["reason"] or "worker thread died before answering" in line["reason"]
    assert hit <= {top1_of(a.body) for a in answers if logged[a.body["esun_uuid"]]["path"] == "error"}

    assert_model_answers([client.post(question(i)) for i in range(100, 104)])
    assert app.extensions[EXTENSION_KEY].engine.stats().restarts == 1
    assert client.ready() == (200, READY)


def test_judge_retries_are_answered_at_once_while_the_first_attempt_is_still_waiting(
    serve: Callable[..., Any], fault_corrector: FaultCorrector, fault_config: Config,
    judge: Callable[[str], JudgeClient], json_log: Callable[[], list[dict[str, Any]]],
) -> None:
    # The judge gave up on attempt 1 (its clock, or the network) while the service still waits on a hung batch:
    # retries 1 and 0 of that question must not queue behind it, and get TOP1 (nothing computed yet).
    _, base = serve(fault_corrector)
    client = judge(base)
    fault_corrector.arm(Hang(HANG_S))
    body = question(0)
    first: list[Answer] = []
    waiter = threading.Thread(target=lambda: first.append(client.post(body)))
    waiter.start()
    assert fault_corrector.hanging.wait(2)
    retries = [client.post({**body, "retry": retry}) for retry in (1, 0)]
    waiter.join(fault_config.judge_timeout_s + 1)

    for retry in retries:
        assert retry.status == 200 and retry.answer == top1_of(body)
        assert retry.elapsed_s < 0.25
    assert first[0].status == 200 and first[0].answer == top1_of(body)  # the first attempt itself: TOP1 at budget
    paths = [line["path"] for line in json_log() if line.get("esun_uuid") == body["esun_uuid"] and "path" in line]
    assert sorted(paths) == ["deadline", "retry_top1", "retry_top1"]
    assert fault_corrector.calls == 1, "a retry reached the model"
