"""The process engine swaps its model one worker process at a time (batching.process_set.WorkerSet.swap): the others
answer meanwhile, every question asked after the swap gets the new model, and a model that fails to build
changes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from batching import BatcherError
from batching.process import ProcessBatcher
from tests.deploy.fake_models import EchoModel


@pytest.fixture
def batcher() -> Iterator[ProcessBatcher[str, Any]]:
    batcher: ProcessBatcher[str, Any] = ProcessBatcher(
        EchoModel, model_init_kwargs={"prefix": "~"}, worker_num=2, max_batch_size=8, max_wait_s=0.01,
        ready_timeout_s=30, name="swap-test")
    yield batcher
    batcher.close(timeout=2)


def ask(batcher: ProcessBatcher[str, Any], item: str = "q") -> Future[Any]:
    return batcher.submit(item, time.monotonic() + 10)


def test_every_question_is_answered_while_the_processes_are_swapped_and_the_new_model_answers_after(batcher):
    old_pids = set(batcher.worker_pids())
    answered: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            answered.append(ask(batcher).result(5))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for c in clients:
        c.start()
    batcher.swap_model({"prefix": "#"}, ready_timeout_s=30)
    after = [ask(batcher).result(5) for _ in range(20)]
    stop.set()
    for c in clients:
        c.join(5)

    assert set(answered) <= {"~Q", "#Q"} and "~Q" in answered  # no failure while swapping: one always answered
    assert after == ["#Q"] * 20
    assert not old_pids & set(batcher.worker_pids())
    assert batcher.alive() and batcher.describe()["init"] == {"prefix": "#"}


def test_a_model_that_fails_to_build_changes_nothing(batcher):
    pids = batcher.worker_pids()

    with pytest.raises(BatcherError, match="exited with code"):
        batcher.swap_model({"prefix": "#", "no_such_setting": 1}, ready_timeout_s=30)

    assert batcher.worker_pids() == pids
    assert [ask(batcher).result(5) for _ in range(4)] == ["~Q"] * 4
    assert batcher.alive() and batcher.describe()["init"] == {"prefix": "~"}


def test_a_set_started_after_a_swap_to_replace_a_dead_one_builds_the_new_model(batcher):
    batcher.swap_model({"prefix": "#"}, ready_timeout_s=30)

    with pytest.raises(Exception):  # noqa: B017 - the batch of the dying worker fails, however it is reported
        ask(batcher, "exit").result(5)
    deadline = time.monotonic() + 30
    while not batcher.alive() and time.monotonic() < deadline:
        time.sleep(0.05)

    assert ask(batcher).result(5) == "#Q"
