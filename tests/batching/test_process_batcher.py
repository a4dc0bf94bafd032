"""batching.process: service-streamer's process-based Streamer, hardened, behind the Batcher interface.

One module-scoped batcher with two spawned workers (starting them takes about a second) serves most tests;
`run_guarded`, the part that runs inside each worker, is also tested in this process.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import hosting.build
from api import create_app
from api.state import EXTENSION_KEY
from batching import BatcherClosed, BatcherError, BatchFailed, BatchReport, DeadlineExceeded, Overloaded
from batching.process import ProcessBatcher, run_guarded
from tests.deploy.fake_models import EchoModel, FailingInitModel

MAX_IN_FLIGHT = 16
LATE_GRACE_S = 0.3


@dataclasses.dataclass
class Hooks:
    batches: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    waits: list[float] = dataclasses.field(default_factory=list)

    def record(self, report: BatchReport) -> None:
        self.batches.append((report.size, report.run_s))
        self.waits.extend(report.queue_wait_s)


@pytest.fixture(scope="module")
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture(scope="module")
def batcher(hooks: Hooks) -> Iterator[ProcessBatcher[str, Any]]:
    """Two EchoModel workers on devices "0" and "1", batches of up to 8 gathered for at most 20 ms."""
    batcher: ProcessBatcher[str, Any] = ProcessBatcher(
        EchoModel, model_init_kwargs={"prefix": "~"}, worker_num=2, cuda_devices=["0", "1"], max_batch_size=8,
        max_wait_s=0.02, max_in_flight=MAX_IN_FLIGHT, late_grace_s=LATE_GRACE_S,
        on_batch=hooks.record,
        ready_timeout_s=30, name="test",
    )
    yield batcher
    batcher.close(timeout=2)


def soon(seconds: float = 2.0) -> float:
    return time.monotonic() + seconds


def wait_until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def busy(batcher: ProcessBatcher[str, Any], seconds: float) -> list[Any]:
    """Keep both workers in a batch for `seconds`: one item each, submitted one window apart."""
    futures = []
    for _ in range(2):
        futures.append(batcher.submit(f"sleep:{seconds}", soon()))
        time.sleep(0.06)  # past the first worker's 20 ms window, so the second item goes to the other worker
    return futures


# --- run_guarded: what each worker runs around the model's predict ---

def test_run_guarded_answers_each_item_in_time_and_marks_late_ones_expired():
    answers = run_guarded(lambda items: [x * 2 for x in items], [(soon(), 1), (time.monotonic() - 1, 2), (soon(), 3)])
    assert [(a.kind, a.value) for a in answers] == [("ok", 2), ("expired", None), ("ok", 6)]
    assert answers[0].batch_size == 2


@pytest.mark.parametrize(("predict", "message"), [
    (lambda items: 1 / 0, "ZeroDivisionError"),
    (lambda items: items[1:], "returned 1 results for 2 items"),
    (lambda items: [threading.Lock() for _ in items], "pickle"),
])
def test_run_guarded_fails_every_item_instead_of_raising(predict, message):
    answers = run_guarded(predict, [(soon(), 1), (soon(), 2)])
    assert [a.kind for a in answers] == ["failed", "failed"]
    assert message in answers[0].error


# --- the batcher, with worker processes ---

def test_process_batcher_answers_concurrent_items_in_shared_batches(batcher, hooks):
    hooks.batches.clear()
    hooks.waits.clear()
    items = [f"q{i}" for i in range(12)]
    futures = [batcher.submit(item, soon()) for item in items]
    assert [f.result(timeout=2) for f in futures] == [f"~Q{i}" for i in range(12)]
    assert sum(size for size, _ in hooks.batches) == 12
    assert len(hooks.batches) < 12
    assert len(hooks.waits) == 12 and all(0 <= w < 0.5 for w in hooks.waits)


def test_process_batcher_assigns_unique_task_ids_under_concurrent_submits(batcher):
    def client(index: int) -> list[tuple[str, Any]]:
        pairs = []
        for n in range(25):
            item = f"c{index}-{n}"
            pairs.append((item, batcher.submit(item, soon(5)).result(timeout=5)))
        return pairs

    with ThreadPoolExecutor(max_workers=8) as pool:
        pairs = [pair for pairs in pool.map(client, range(8)) for pair in pairs]
    assert len(pairs) == 200
    assert all(answer == "~" + item.upper() for item, answer in pairs)
    assert batcher.stats().in_flight == 0
    assert batcher.streamer._future_cache == {}  # the library's futures are never left behind


def test_process_batcher_places_workers_on_cuda_devices_round_robin(batcher):
    devices = set()
    # "gpu" goes to whichever worker is not sleeping on the blocker; a few rounds see both (1 in 2 ** 9 fails).
    for _ in range(10):
        blocker = batcher.submit("sleep:0.15", soon())
        time.sleep(0.06)
        devices.add(batcher.submit("gpu", soon()).result(timeout=2))
        blocker.result(timeout=2)
        if devices == {"0", "1"}:
            break
    assert devices == {"0", "1"}


def test_process_batcher_fails_only_the_raising_batch_and_keeps_its_worker(batcher):
    pids = batcher.worker_pids()
    failures = batcher.stats().failures
    with pytest.raises(BatchFailed, match=r"RuntimeError\('boom'\)"):
        batcher.submit("boom", soon()).result(timeout=2)
    with pytest.raises(BatchFailed, match="returned 0 results for 1 items"):
        batcher.submit("short", soon()).result(timeout=2)
    with pytest.raises(BatchFailed, match="pickle"):
        batcher.submit("lambda", soon()).result(timeout=2)
    assert batcher.submit("after", soon()).result(timeout=2) == "~AFTER"
    assert batcher.worker_pids() == pids
    stats = batcher.stats()
    assert stats.failures == failures + 3 and stats.restarts == 0 and batcher.alive()


def test_process_batcher_drops_items_whose_deadline_passed_in_the_queue(batcher):
    dropped = batcher.stats().dropped_expired
    blockers = busy(batcher, 0.3)
    late = batcher.submit("late", time.monotonic() + 0.05)
    with pytest.raises(DeadlineExceeded):
        late.result(timeout=2)
    for f in blockers:
        f.result(timeout=2)
    assert batcher.stats().dropped_expired == dropped + 1
    with pytest.raises(DeadlineExceeded):
        batcher.submit("already late", time.monotonic() - 0.01).result(timeout=0)


def test_a_waiter_that_gives_up_at_its_deadline_cannot_discard_an_answer_a_worker_is_computing(batcher):
    running = batcher.submit("sleep:0.5", time.monotonic() + 0.3)
    with pytest.raises(TimeoutError):
        running.result(timeout=0.3)
    assert not running.cancel(), "an item in another process cannot be taken back"
    assert running.result(timeout=2) == "~SLEEP:0.5"  # the late answer still arrives (api.answers keeps it)


def test_process_batcher_refuses_items_past_max_in_flight(batcher):
    overloaded = batcher.stats().overloaded
    futures = [batcher.submit("sleep:0.2", soon()) for _ in range(MAX_IN_FLIGHT)]
    with pytest.raises(Overloaded, match="max_in_flight is 16"):
        batcher.submit("one too many", soon())
    assert all(f.result(timeout=2) == "~SLEEP:0.2" for f in futures)
    assert batcher.stats().overloaded == overloaded + 1
    assert batcher.submit("room again", soon()).result(timeout=2) == "~ROOM AGAIN"


def test_process_batcher_replaces_a_dead_worker_and_fails_its_item_at_once(batcher):
    restarts = batcher.stats().restarts
    doomed = batcher.submit("exit", time.monotonic() + 5.0)
    with pytest.raises(BatchFailed, match="a worker process died"):
        doomed.result(timeout=2.0)  # well before its deadline: not left to the grace
    wait_until(lambda: batcher.stats().restarts == restarts + 1 and batcher.streamer.ready_count() == 2, 10)
    assert batcher.alive()
    assert [batcher.submit(f"r{i}", soon()).result(timeout=2) for i in range(3)] == ["~R0", "~R1", "~R2"]
    assert batcher.stats().in_flight == 0


def test_process_batcher_raises_when_a_worker_cannot_build_its_model():
    with pytest.raises(BatcherError, match="worker 0 exited with code 1 while building its model"):
        ProcessBatcher(FailingInitModel, worker_num=1, ready_timeout_s=30)


def test_process_batcher_close_fails_items_left_and_refuses_new_ones():
    batcher: ProcessBatcher[str, Any] = ProcessBatcher(EchoModel, worker_num=1, max_wait_s=0.0, ready_timeout_s=30)
    held = batcher.submit("sleep:2", soon(5))
    time.sleep(0.1)
    started = time.monotonic()
    batcher.close(timeout=0.3)
    assert time.monotonic() - started < 3
    with pytest.raises(BatcherClosed):
        held.result(timeout=0)
    with pytest.raises(BatcherClosed):
        batcher.submit("x", soon())
    assert not batcher.alive()
    assert all(p.exitcode is not None for p in batcher.streamer._worker_ps)


def test_create_app_serves_from_worker_processes_when_batcher_workers_above_one(config, monkeypatch, make_body):
    monkeypatch.setattr(hosting.build, "CORRECTOR_TARGET", "tests.deploy.fake_models:PicklableCorrector")
    app = create_app(dataclasses.replace(config, batcher_workers=2))
    try:
        client = app.test_client()
        response = client.post("/inference", json=make_body())
        assert response.get_json()["answer"] == "改喂你好密碼我要進去"
        assert client.get("/readyz").status_code == 200
        assert client.get("/").get_json()["model"]["workers"] == 2
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))
                   for s in family.samples}
        assert samples[("esun_request_duration_seconds_count", (("path", "model"),))] == 1
        assert samples[("esun_batch_size_count", ())] == 1
        assert samples[("esun_batch_queue_wait_seconds_count", ())] == 1
    finally:
        app.extensions[EXTENSION_KEY].engine.close(timeout=2)


def test_the_process_engine_loads_where_the_link_leads_and_swaps_its_processes_when_it_is_repointed(
        config, monkeypatch, make_body, tmp_path, caplog):
    """Issue 47 on the process engine: its processes load the folder the link leads to, never the link (a set started
    later to replace a dead one loads the same); a repointed link is swapped in process by process, a broken folder
    is refused and changes nothing."""
    import logging

    from config import DEFAULT_WEIGHTS_DIR

    monkeypatch.setattr(hosting.build, "CORRECTOR_TARGET", "tests.deploy.fake_models:PicklableCorrector")
    for name in ("a", "b", "broken"):
        (tmp_path / name).mkdir()
        for part in DEFAULT_WEIGHTS_DIR.iterdir():
            if not (name == "broken" and part.name == "vocab.json"):
                (tmp_path / name / part.name).symlink_to(part)
    (tmp_path / "current").symlink_to(tmp_path / "a")
    app = create_app(dataclasses.replace(config, batcher_workers=2, weights_dir=tmp_path / "current",
                                         weights_poll_s=0.0))
    state = app.extensions[EXTENSION_KEY]
    client = app.test_client()
    caplog.set_level(logging.INFO, logger="hosting.swap")
    try:
        assert state.engine.describe()["init"]["kwargs"]["weights_dir"] == tmp_path / "a"
        pids = state.engine.worker_pids()
        for name, result in (("broken", "failed"), ("b", "done")):
            (tmp_path / "current").unlink()
            (tmp_path / "current").symlink_to(tmp_path / name)
            assert state.host.swapper.check() == result

        assert state.engine.describe()["init"]["kwargs"]["weights_dir"] == tmp_path / "b"
        assert not set(pids) & set(state.engine.worker_pids())
        assert client.post("/inference", json=make_body()).get_json()["answer"] == "改喂你好密碼我要進去"
        serving = client.get("/").get_json()["serving"]
        assert serving["folder"] == str(tmp_path / "b") and serving["swaps"] == {"done": 1, "failed": 1}
        assert [r.fields["event"] for r in caplog.records if r.name == "hosting.swap"] == ["model_swap_failed",
                                                                                       "model_swapped"]
    finally:
        state.host.swapper.close()
        state.engine.close(timeout=2)


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "items-queued"])
def test_process_batcher_recovers_from_a_worker_killed_with_sigkill(batcher, queued):
    """Regression: a worker killed (kill -9, as the OOM killer does) while it waited in the shared queue's get took
    the queue's read lock with it; the other worker and the replacement then waited on it forever, every item ran
    out its deadline, and alive() stayed true."""
    import os
    import signal

    wait_until(lambda: batcher.streamer.ready_count() == 2, 10)
    for _ in range(3):  # whichever worker holds the lock, killing each in turn finds it
        restarts = batcher.stats().restarts
        held = busy(batcher, 0.5) if queued else []
        victim = next(pid for pid in batcher.worker_pids() if pid is not None)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        for future in held:  # what the killed generation held is answered at once, not at its deadline
            with pytest.raises(BatchFailed, match="worker process"):
                future.result(timeout=2.0)
        wait_until(lambda r=restarts: batcher.stats().restarts > r, 5)
        wait_until(lambda: batcher.alive() and batcher.streamer.ready_count() == 2, 5)
        assert batcher.submit("back", soon()).result(timeout=2) == "~BACK"
        assert time.monotonic() - killed_at < 5.0
    assert batcher.stats().in_flight == 0


def test_while_the_process_engine_replaces_its_workers_questions_answer_model_loading_at_once(config, monkeypatch,
                                                                                               make_body):
    """Issue 31: a killed worker's set is replaced, and while the new one loads no model can answer: a question
    asked then is TOP1 under `model_loading` at once, not after waiting out its budget (`deadline`)."""
    import os
    import signal

    monkeypatch.setattr(hosting.build, "CORRECTOR_TARGET", "tests.deploy.fake_models:SlowSetupCorrector")
    app = create_app(dataclasses.replace(config, batcher_workers=2))
    engine = app.extensions[EXTENSION_KEY].engine
    try:
        client = app.test_client()
        assert client.post("/inference", json=make_body(esun_uuid="before")).get_json()["answer"] == \
            "改喂你好密碼我要進去"
        assert not engine.loading()
        os.kill(engine.worker_pids()[0], signal.SIGKILL)
        wait_until(lambda: engine.stats().restarts == 1, 5)
        assert engine.loading()  # the new set takes SlowSetupCorrector.SETUP_S to load
        assert client.post("/inference", json=make_body(esun_uuid="during")).get_json()["answer"] == \
            "喂你好密碼我要進去"
        wait_until(lambda: not engine.loading(), 10)
        assert client.post("/inference", json=make_body(esun_uuid="after")).get_json()["answer"] == \
            "改喂你好密碼我要進去"
        paths = {s.labels["path"]: s.value
                 for family in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))
                 for s in family.samples if s.name == "esun_request_duration_seconds_count" and s.value}
        assert paths == {"model": 2, "model_loading": 1}
    finally:
        engine.close(timeout=2)
