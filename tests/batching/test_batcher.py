"""Tests of batching.Batcher (the threaded engine) and batching.policy with fake batch functions; tests named
test_bare_streamer_* show the library's defects."""

from __future__ import annotations

import concurrent.futures
import ctypes
import math
import threading
import time
from collections.abc import Callable, Iterator
from queue import Queue
from typing import Any

import pytest
import service_streamer.service_streamer as ss

from batching import Batcher, BatcherClosed, BatchFailed, BatchReport, DeadlineExceeded, Overloaded, core
from batching.policy import Traffic, Window, adaptive_wait_s, similar_sizes

MakeBatcher = Callable[..., Batcher[Any, Any]]


class HeldFn:
    """Fake batch function: records each batch and its start time, doubles items, holds its first call open."""

    def __init__(self, hold_first: bool = True, fail_on: object = None, run_s: float = 0.0) -> None:
        self.batches: list[list[Any]] = []
        self.started: list[float] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._hold_first = hold_first
        self._fail_on = fail_on
        self._run_s = run_s

    def __call__(self, items: list[Any]) -> list[Any]:
        self.started.append(time.monotonic())
        self.batches.append(list(items))
        if self._hold_first and len(self.batches) == 1:
            self.entered.set()
            self.release.wait(5)
        if self._run_s:
            time.sleep(self._run_s)
        if self._fail_on is not None and self._fail_on in items:
            raise ValueError(f"cannot handle {self._fail_on!r}")
        return [item * 2 for item in items]


class SlowInt(int):
    """An int whose + sleeps, widening the gap between reading _task_id and storing it back."""

    def __add__(self, other: int) -> SlowInt:
        time.sleep(0.002)
        return SlowInt(int(self) + other)


def soon(seconds: float = 5.0) -> float:
    """Return a deadline this many seconds from now."""
    return time.monotonic() + seconds


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll condition until it holds or timeout passes; return its last value."""
    until = time.monotonic() + timeout
    while not condition() and time.monotonic() < until:
        time.sleep(0.005)
    return condition()


@pytest.fixture
def make_batcher() -> Iterator[MakeBatcher]:
    made: list[Batcher[Any, Any]] = []

    def make(fn: Callable[[list[Any]], list[Any]], **kwargs: Any) -> Batcher[Any, Any]:
        batcher: Batcher[Any, Any] = Batcher(fn, **kwargs)
        made.append(batcher)
        return batcher

    yield make
    for batcher in made:
        batcher.close(timeout=0.5)


@pytest.fixture
def bare_streamers() -> Iterator[list[ss.ThreadedStreamer]]:
    made: list[ss.ThreadedStreamer] = []
    yield made
    for streamer in made:
        # The library's collector thread cannot be stopped; it is a daemon polling once a second.
        streamer._worker_destroy_event.set()
        streamer._worker_thread.join(1)


# Defect 1: an exception in the batch function kills the worker.


def test_bare_streamer_worker_dies_after_one_exception(
    monkeypatch: pytest.MonkeyPatch, bare_streamers: list[ss.ThreadedStreamer]
) -> None:
    """Bug guarded: service-streamer's worker thread dies on one exception; every later call times out."""
    monkeypatch.setattr(ss, "WORKER_TIMEOUT", 0.2)
    died: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_type))
    streamer = ss.ThreadedStreamer(HeldFn(hold_first=False, fail_on=1), 4, 0.01)
    bare_streamers.append(streamer)

    with pytest.raises(TimeoutError):
        streamer.predict([1])
    streamer._worker_thread.join(1)
    assert not streamer._worker_thread.is_alive()
    assert died == [ValueError]
    with pytest.raises(TimeoutError):
        streamer.predict([2])


def test_batcher_fails_only_the_raising_batch_and_keeps_serving(make_batcher: MakeBatcher) -> None:
    """Bug guarded: one exception in the batch function killed the worker; only that batch may fail."""
    fn = HeldFn(fail_on="boom")
    batcher = make_batcher(fn)
    first = batcher.submit("a", soon())
    assert fn.entered.wait(2)
    doomed = [batcher.submit("boom", soon()), batcher.submit("c", soon())]
    fn.release.set()

    assert first.result(timeout=2) == "aa"
    for future in doomed:
        with pytest.raises(BatchFailed) as caught:
            future.result(timeout=2)
        assert isinstance(caught.value.__cause__, ValueError)
    assert batcher.submit("d", soon()).result(timeout=2) == "dd"
    stats = batcher.stats()
    assert (stats.batches, stats.failures, stats.restarts) == (3, 1, 0)
    assert stats.worker_alive and batcher.alive()


def test_batcher_fails_batch_when_output_length_differs(make_batcher: MakeBatcher) -> None:
    batcher = make_batcher(lambda items: items[:-1])
    with pytest.raises(BatchFailed, match="returned 0 results for 1 items"):
        batcher.submit("a", soon()).result(timeout=2)
    assert batcher.stats().failures == 1


class KillWorker(BaseException):
    """Escapes `except Exception`, as SystemExit would, so it ends the worker thread."""


def test_batcher_restarts_worker_after_its_thread_dies(make_batcher: MakeBatcher) -> None:
    def fn(items: list[str]) -> list[str]:
        if "die" in items:
            raise KillWorker
        return [item * 2 for item in items]

    batcher = make_batcher(fn)
    with pytest.raises(BatchFailed):
        batcher.submit("die", soon()).result(timeout=2)
    assert wait_until(lambda: batcher.stats().restarts == 1)
    assert batcher.submit("x", soon()).result(timeout=2) == "xx"
    assert batcher.alive()


def test_batcher_recovers_when_worker_thread_is_killed_from_outside(make_batcher: MakeBatcher) -> None:
    batcher = make_batcher(lambda items: [item * 2 for item in items])
    victim = batcher.streamer._worker_thread
    assert victim.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(victim.ident), ctypes.py_object(SystemExit))
    victim.join(2)

    assert not victim.is_alive()
    assert wait_until(batcher.alive)
    assert batcher.stats().restarts == 1
    assert batcher.submit(4, soon()).result(timeout=2) == 8


# Defect 2: a timed-out call leaves its future in _future_cache forever.


def test_bare_streamer_keeps_timed_out_future_forever(
    monkeypatch: pytest.MonkeyPatch, bare_streamers: list[ss.ThreadedStreamer]
) -> None:
    """Bug guarded: service-streamer pops a future only in result(); a caller that timed out never pops it."""
    monkeypatch.setattr(ss, "WORKER_TIMEOUT", 0.01)
    streamer = ss.ThreadedStreamer(HeldFn(hold_first=False, run_s=0.05), 4, 0.01)
    bare_streamers.append(streamer)

    with pytest.raises(TimeoutError):
        streamer.predict([1])
    future = streamer._future_cache[0]
    assert future._finish_event.wait(2)  # the answer arrived, but nobody is left to collect it
    assert list(streamer._future_cache) == [0]


def test_batcher_keeps_nothing_of_1000_callers_that_timed_out(make_batcher: MakeBatcher) -> None:
    """Bug guarded: every caller that timed out leaked one streamer future; the batcher makes none (one future per
    item, its own), and 1,000 timed-out callers leave nothing in flight."""
    fn = HeldFn()
    batcher = make_batcher(fn, max_in_flight=2000)
    cache = batcher.streamer._future_cache
    held = batcher.submit(-1, soon())
    assert fn.entered.wait(2)

    futures = []
    for i in range(1000):
        # Odd items expire while the batch is held; even ones are answered after their waiter gave up.
        future = batcher.submit(i, soon(0.3 if i % 2 else 5.0))
        with pytest.raises(TimeoutError):
            future.result(timeout=0)
        futures.append(future)
    time.sleep(0.4)
    fn.release.set()

    assert held.result(timeout=2) == -2
    assert not concurrent.futures.wait(futures, timeout=5).not_done
    assert all(isinstance(f.exception(), DeadlineExceeded) for f in futures[1::2])
    assert [f.result() for f in futures[::2]] == [2 * i for i in range(0, 1000, 2)]
    assert wait_until(lambda: batcher.stats().in_flight == 0)
    assert cache == {}


# Defect 3: _input bumps _task_id without a lock.


def test_bare_streamer_task_ids_collide_under_concurrent_submit(
    monkeypatch: pytest.MonkeyPatch, bare_streamers: list[ss.ThreadedStreamer]
) -> None:
    """Bug guarded: two threads in _input read the same _task_id; one gets both answers, the other none."""
    # The surplus answer can also reach a popped task and kill the collector thread with a KeyError.
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    both_read = threading.Barrier(2, timeout=2)

    class MeetingInt(int):
        """An int whose + returns once two threads are inside it, i.e. both read the same _task_id."""

        def __add__(self, other: int) -> MeetingInt:
            both_read.wait()
            return MeetingInt(int(self) + other)

    streamer = ss.ThreadedStreamer(HeldFn(hold_first=False), 8, 0.01)
    bare_streamers.append(streamer)
    streamer._task_id = MeetingInt(0)
    barrier = threading.Barrier(2)
    answers: dict[int, tuple[int, object]] = {}

    def client(x: int) -> None:
        barrier.wait()
        future = streamer.submit([x])
        try:
            answers[x] = (future._id, future.result(timeout=0.5))
        except TimeoutError:
            answers[x] = (future._id, None)

    threads = [threading.Thread(target=client, args=(x,)) for x in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3)

    assert streamer._task_id == 1  # two tasks, one bump: both got task id 0
    assert answers[1][0] == answers[2][0] == 0
    assert (answers[1][1], answers[2][1]) != ([2], [4])


def test_batcher_answers_each_of_64_threads_with_its_own_result(make_batcher: MakeBatcher) -> None:
    """Bug guarded: the unlocked _task_id read-and-bump; the batcher never calls _input, and 64 racing callers each
    get their own answer."""
    batcher = make_batcher(lambda xs: [x * 2 for x in xs])
    batcher.streamer._task_id = SlowInt(0)  # widened, as in the bare test: unused, so it cannot bite
    barrier = threading.Barrier(64)
    answers: dict[int, int] = {}

    def client(x: int) -> None:
        barrier.wait()
        answers[x] = batcher.submit(x, soon()).result(timeout=5)

    threads = [threading.Thread(target=client, args=(x,)) for x in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)

    assert answers == {x: 2 * x for x in range(64)}
    assert batcher.streamer._task_id == 0 and batcher.streamer._future_cache == {}


# One future per item: the library's output side (second futures, output queue, collector thread) is not used.


def test_batcher_settles_each_item_exactly_once_on_its_own_future_without_a_collector(
    make_batcher: MakeBatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every resolver (batch thread, monitor, close, a revived worker) goes through settle: each item, answered,
    expired or failed, is settled by one call, and the batcher starts its worker and monitor, no collector."""
    calls: dict[int, list[bool]] = {}
    real_settle = core.settle

    def counting_settle(future: concurrent.futures.Future[Any], **outcome: Any) -> bool:
        settled = real_settle(future, **outcome)
        calls.setdefault(id(future), []).append(settled)
        return settled

    for module in ("batching.core", "batching.threaded", "batching.threaded_worker"):
        monkeypatch.setattr(f"{module}.settle", counting_settle)
    before = set(threading.enumerate())
    fn = HeldFn(hold_first=True, fail_on=99)
    batcher = make_batcher(fn, name="one-future")
    started = {t.name for t in threading.enumerate() if t not in before}
    assert started == {"one-future-worker", "one-future-monitor"}

    futures = [batcher.submit(0, soon())]
    assert fn.entered.wait(2)
    futures += [batcher.submit(x, soon()) for x in range(1, 7)]
    late = batcher.submit(7, soon(0.1))
    settled_on: list[str] = []
    for future in futures:
        future.add_done_callback(lambda _f: settled_on.append(threading.current_thread().name))
    assert wait_until(late.done)  # expired by the monitor while the first batch is held
    fn.release.set()
    assert [f.result(timeout=2) for f in futures] == [2 * x for x in range(7)]
    failed = batcher.submit(99, soon())
    assert isinstance(failed.exception(timeout=2), BatchFailed)
    assert isinstance(late.exception(), DeadlineExceeded)

    assert wait_until(lambda: len(settled_on) == 7)
    assert set(settled_on) == {"one-future-worker"}  # settled where the batch ran, not by a collector
    assert sorted(calls.values()) == [[True]] * 9  # 7 answered, 1 expired, 1 failed: one call each
    assert {t.name for t in threading.enumerate() if t not in before} <= started
    assert not batcher.streamer.back_thread.is_alive() and batcher.streamer._future_cache == {}


def test_the_service_streamer_members_the_engine_relies_on_are_where_0_1_2_has_them() -> None:
    """Guards the private members batching.threaded and batching.threaded_worker were built on (0.1.2)."""
    assert ss.__name__ == "service_streamer.service_streamer"
    # _BaseStreamer.__init__ builds the collector thread but does not start it.
    base = ss._BaseStreamer()
    assert isinstance(base.back_thread, threading.Thread) and not base.back_thread.is_alive()
    # ThreadedStreamer._send_request puts (client, task id, request id, input) on _input_queue.
    streamer = ss.ThreadedStreamer.__new__(ss.ThreadedStreamer)
    streamer._input_queue = Queue()
    streamer._send_request(3, 0, "item")
    assert streamer._input_queue.get_nowait() == (0, 3, 0, "item")
    # ThreadedWorker keeps its queue and destroy event, times out with TimeoutError, predicts with the function;
    # run_forever calls _run_once until the destroy event is set.
    requests: Queue[Any] = Queue()
    destroy = threading.Event()

    class Once(ss.ThreadedWorker):
        def _run_once(self) -> int:
            destroy.set()
            return 1

    worker = Once(lambda xs: [x * 2 for x in xs], 4, 0.1, requests, None, destroy_event=destroy)
    assert worker._request_queue is requests and worker._destroy_event is destroy
    with pytest.raises(TimeoutError):
        worker._recv_request(timeout=0.0)
    assert worker.model_predict([1, 2]) == [2, 4]
    worker.run_forever()
    assert destroy.is_set()


# Defect 4: unbounded queues.


def test_bare_streamer_queues_without_bound(bare_streamers: list[ss.ThreadedStreamer]) -> None:
    """Bug guarded: service-streamer's queues are unbounded, so a stalled worker lets work pile up."""
    fn = HeldFn()
    streamer = ss.ThreadedStreamer(fn, 4, 0.01)
    bare_streamers.append(streamer)
    streamer.submit([0])
    assert fn.entered.wait(2)
    for i in range(500):
        streamer.submit([i])
    assert streamer._input_queue.qsize() == 500
    fn.release.set()


def test_batcher_submit_raises_overloaded_at_max_in_flight(make_batcher: MakeBatcher) -> None:
    """Bug guarded: unbounded queues; past max_in_flight, submit must refuse at once."""
    fn = HeldFn()
    batcher = make_batcher(fn, max_in_flight=4)
    futures = [batcher.submit(0, soon())]
    assert fn.entered.wait(2)
    futures += [batcher.submit(i, soon()) for i in (1, 2, 3)]

    started = time.monotonic()
    with pytest.raises(Overloaded):
        batcher.submit(4, soon())
    assert time.monotonic() - started < 0.05
    assert (batcher.stats().in_flight, batcher.stats().overloaded) == (4, 1)

    fn.release.set()
    assert [f.result(timeout=2) for f in futures] == [0, 2, 4, 6]
    assert wait_until(lambda: batcher.stats().in_flight == 0)
    assert batcher.submit(5, soon()).result(timeout=2) == 10


# Defect 5: expired items still reach the batch function.


def test_batcher_drops_expired_items_before_the_batch_function(make_batcher: MakeBatcher) -> None:
    """Bug guarded: service-streamer runs every item however late; an expired one must not reach fn."""
    fn = HeldFn()
    batcher = make_batcher(fn)
    first = batcher.submit("a", soon())
    assert fn.entered.wait(2)
    late = batcher.submit("b", soon(0.05))
    on_time = batcher.submit("c", soon())
    time.sleep(0.1)
    fn.release.set()

    with pytest.raises(DeadlineExceeded):
        late.result(timeout=2)
    assert (first.result(timeout=2), on_time.result(timeout=2)) == ("aa", "cc")
    assert all("b" not in batch for batch in fn.batches)
    assert batcher.stats().dropped_expired == 1


def test_batcher_fails_item_whose_deadline_already_passed_at_submit(make_batcher: MakeBatcher) -> None:
    fn = HeldFn(hold_first=False)
    batcher = make_batcher(fn)
    with pytest.raises(DeadlineExceeded):
        batcher.submit("a", time.monotonic() - 1).result(timeout=0)
    assert fn.batches == []


def test_batcher_fails_queued_item_at_deadline_while_a_batch_hangs(make_batcher: MakeBatcher) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn)
    batcher.submit("a", soon())
    assert fn.entered.wait(2)
    waiting = batcher.submit("b", soon(0.05))
    with pytest.raises(DeadlineExceeded):
        waiting.result(timeout=1)  # answered by the monitor although the worker is still busy
    fn.release.set()


# Defect 6: the window can reach twice max_latency.


class _StartsAWorkerWhenAsked(concurrent.futures.Future):
    """A future whose first `running()` check (the monitor's) lets a worker try to start its job meanwhile."""

    def __init__(self, start_job: Callable[[], bool]) -> None:
        super().__init__()
        self._start_job = start_job
        self.started: list[bool] = []
        self._worker: threading.Thread | None = None

    def running(self) -> bool:
        if self._worker is None:
            self._worker = threading.Thread(target=lambda: self.started.append(self._start_job()))
            self._worker.start()
            self._worker.join(0.2)  # a worker that can start the job now does so before the monitor acts
        return super().running()

    def join_worker(self) -> None:
        assert self._worker is not None
        self._worker.join(2)


def test_a_job_the_monitor_expires_as_a_worker_starts_it_either_runs_or_expires_never_both() -> None:
    lifecycle: core.Core[str, str] = core.Core(max_in_flight=4, name="t")
    holder: dict[str, Any] = {}
    read_before_deadline = time.monotonic()  # a worker reads the clock once per batch, before this job's deadline
    future = _StartsAWorkerWhenAsked(lambda: lifecycle.start(holder["job"], read_before_deadline))
    job = core.Job("item", read_before_deadline + 0.01, future, enqueued_at=read_before_deadline)
    holder["job"] = job
    time.sleep(0.02)  # now overdue

    lifecycle.expire_unstarted(job)
    future.join_worker()

    assert future.started == [False], "the worker started a job the monitor was expiring"
    with pytest.raises(DeadlineExceeded):
        future.result(timeout=0)
    assert lifecycle.tally.snapshot(0, True, 0.0).dropped_expired == 1


def test_bare_streamer_window_can_reach_twice_max_latency(bare_streamers: list[ss.ThreadedStreamer]) -> None:
    """Bug guarded: each _recv_request waits max_latency and the total is checked after it, so ~2x."""
    fn = HeldFn()
    streamer = ss.ThreadedStreamer(fn, 64, 0.2)
    bare_streamers.append(streamer)
    streamer.submit([0])
    assert fn.entered.wait(2)
    streamer.submit([1])
    released = time.monotonic()
    fn.release.set()
    time.sleep(0.1)
    streamer.submit([2])  # arrives inside the per-item timeout, which re-arms for another full max_latency

    assert wait_until(lambda: len(fn.started) == 2)
    assert fn.started[1] - released > 0.28


def test_batcher_fixed_window_is_bounded_by_max_wait(make_batcher: MakeBatcher) -> None:
    """Bug guarded: the library's window reaching twice max_latency; the fixed policy closes at max_wait_s."""
    fn = HeldFn()
    batcher = make_batcher(fn, policy="fixed", max_wait_s=0.2)
    batcher.submit(0, soon())
    assert fn.entered.wait(2)
    batcher.submit(1, soon())
    released = time.monotonic()
    fn.release.set()
    time.sleep(0.1)
    batcher.submit(2, soon())

    assert wait_until(lambda: len(fn.started) == 2)
    assert fn.started[1] - released < 0.28
    assert fn.batches[1] == [1, 2]  # the window still gathers


# Adaptive dispatch.


def test_batcher_runs_lone_request_at_once_when_idle(make_batcher: MakeBatcher) -> None:
    batcher = make_batcher(lambda xs: xs, max_wait_s=1.0)
    started = time.monotonic()
    assert batcher.submit("x", soon()).result(timeout=2) == "x"
    assert time.monotonic() - started < 0.25


def test_batcher_gathers_requests_queued_during_a_run_into_next_batch(make_batcher: MakeBatcher) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn)
    batcher.submit(0, soon())
    assert fn.entered.wait(2)
    futures = [batcher.submit(i, soon()) for i in range(1, 6)]
    fn.release.set()

    assert [f.result(timeout=2) for f in futures] == [2, 4, 6, 8, 10]
    assert fn.batches == [[0], [1, 2, 3, 4, 5]]
    assert batcher.stats().last_batch_size == 5


def test_batcher_window_never_holds_an_item_past_its_deadline(make_batcher: MakeBatcher) -> None:
    # A long max_wait_s leaves the deadline as the only bound on the window under a steady stream.
    fn = HeldFn(hold_first=False, run_s=0.02)
    batcher = make_batcher(fn, max_wait_s=1.0)
    futures = []
    deadlines = {}
    for i in range(40):
        deadlines[i] = soon(0.15)
        futures.append(batcher.submit(i, deadlines[i]))
        time.sleep(0.004)

    assert [f.result(timeout=2) for f in futures] == [2 * i for i in range(40)]
    for started, batch in zip(fn.started, fn.batches, strict=True):
        assert started <= min(deadlines[i] for i in batch)


def load_up(batcher: Batcher[Any, Any], fn: HeldFn, items: int, seconds: float) -> list[Any]:
    """Keep `items` items in the batcher for `seconds` (fn's first call held open), then let them finish."""
    futures = [batcher.submit(0, soon())]
    assert fn.entered.wait(2)
    futures += [batcher.submit(i, soon()) for i in range(1, items)]
    time.sleep(seconds)
    fn.release.set()
    return [f.result(timeout=2) for f in futures]


def test_loaded_batcher_holds_an_idle_arrival_until_the_batch_is_full(make_batcher: MakeBatcher) -> None:
    # Four items in flight for a second put the load average above half a batch of 4: throughput mode.
    fn = HeldFn()
    batcher = make_batcher(fn, max_batch_size=4, max_wait_s=0.5)
    load_up(batcher, fn, items=4, seconds=1.0)
    futures = [batcher.submit(10, soon())]  # finds the batch function idle
    time.sleep(0.05)
    futures += [batcher.submit(i, soon()) for i in (11, 12, 13)]

    assert [f.result(timeout=2) for f in futures] == [20, 22, 24, 26]
    assert fn.batches[-1] == [10, 11, 12, 13]


def test_loaded_batcher_dispatches_when_the_stream_pauses(make_batcher: MakeBatcher) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn, max_batch_size=4, max_wait_s=5.0)
    load_up(batcher, fn, items=4, seconds=1.0)
    for i in range(6):  # a stream at one item per 5 ms teaches the gap; then it stops with a batch half full
        batcher.submit(i, soon())
        time.sleep(0.005)
    stopped = time.monotonic()

    assert wait_until(lambda: sum(len(batch) for batch in fn.batches) == 10)
    assert fn.started[-1] - stopped < 1.0  # far sooner than max_wait_s: waiting could not fill it


def test_traffic_peak_is_the_most_items_at_once_over_the_last_window_or_two() -> None:
    traffic = Traffic()
    for now, count in [(100.1, 1), (100.2, 5), (100.3, 2), (101.5, 3)]:
        traffic.note_count(now, count)
    assert traffic.peak(101.6) == 5  # the previous window's peak still counts
    assert traffic.peak(102.4) == 3  # it is gone two windows later; 3 is still held
    traffic.note_count(102.5, 0)
    assert traffic.peak(104.9) == 0


def test_loaded_batcher_runs_as_soon_as_every_recent_item_is_back(make_batcher: MakeBatcher) -> None:
    # Throughput mode with fewer clients than a batch: 3 items at most were in flight, so the fourth never
    # comes; the batch goes when the 3 are back, not after the patience or the window.
    fn = HeldFn()
    batcher = make_batcher(fn, max_batch_size=4, max_wait_s=5.0)
    load_up(batcher, fn, items=3, seconds=1.0)
    started = time.monotonic()
    futures = [batcher.submit(i, soon()) for i in (10, 11, 12)]
    assert [f.result(timeout=2) for f in futures] == [20, 22, 24]
    assert time.monotonic() - started < 0.2


def test_traffic_load_average_rises_fast_and_falls_slowly() -> None:
    traffic = Traffic()
    traffic.note_count(100.0, 10)
    assert traffic.load(100.0) == pytest.approx(traffic.load(99.0), abs=1e-9)  # no time at 10 yet
    assert traffic.load(100.2) == pytest.approx(10 * (1 - math.exp(-1.0)), rel=0.01)  # rise: 0.2 s
    assert traffic.load(120.0) == pytest.approx(10.0, rel=1e-6)
    traffic.note_count(120.0, 0)
    assert traffic.load(121.0) == pytest.approx(10 * math.exp(-1.0), rel=0.01)  # fall: 1 s


BUSY = {"now": 10.0, "waiting": 3, "opened_at": 10.0, "arrived_idle": False, "earliest_deadline": 12.0}
LOADED = {**BUSY, "load": 6.0, "peak": 8, "span_s": 0.003}  # 3 items in 3 ms: a burst


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        pytest.param(Window(**BUSY, gap_s=0.01, run_s_next=0.2), 0.01, id="busy-stream-waits-one-gap"),
        pytest.param(Window(**{**BUSY, "arrived_idle": True}, gap_s=0.01, run_s_next=0.2), 0.0, id="idle"),
        pytest.param(Window(**{**BUSY, "waiting": 8}, gap_s=0.01, run_s_next=0.2), 0.0, id="full"),
        pytest.param(Window(**BUSY, gap_s=None, run_s_next=0.2), 0.0, id="no-traffic-seen"),
        pytest.param(Window(**BUSY, gap_s=0.01, run_s_next=0.0), 0.0, id="run-time-unknown"),
        pytest.param(Window(**BUSY, gap_s=0.06, run_s_next=0.2), 0.0, id="wait-costs-more-than-it-saves"),
        pytest.param(Window(**{**BUSY, "earliest_deadline": 10.205}, gap_s=0.01, run_s_next=0.2), 0.0, id="deadline"),
        pytest.param(Window(**{**BUSY, "opened_at": 9.855}, gap_s=0.01, run_s_next=0.2), 0.0, id="max-wait"),
        # Heavy load (load average >= half of max_batch_size 8): hold for a full batch, patience 10 gaps.
        pytest.param(Window(**LOADED, gap_s=0.01, run_s_next=0.2), 0.1, id="loaded-waits-ten-gaps"),
        pytest.param(Window(**{**LOADED, "arrived_idle": True}, gap_s=0.01, run_s_next=0.2), 0.1, id="loaded-idle"),
        pytest.param(Window(**LOADED, gap_s=0.06, run_s_next=0.2), 0.15, id="loaded-waits-to-max-wait"),
        pytest.param(Window(**{**LOADED, "waiting": 8}, gap_s=0.01, run_s_next=0.2), 0.0, id="loaded-full"),
        pytest.param(
            Window(**{**LOADED, "earliest_deadline": 10.205}, gap_s=0.01, run_s_next=0.2), 0.0, id="loaded-deadline"
        ),
        pytest.param(Window(**{**LOADED, "load": 3.9}, gap_s=0.06, run_s_next=0.2), 0.0, id="under-half-is-light"),
        pytest.param(Window(**{**LOADED, "peak": 3}, gap_s=0.01, run_s_next=0.2), 0.0, id="loaded-all-of-peak-here"),
        pytest.param(Window(**LOADED, gap_s=0.001, run_s_next=0.2), 0.05, id="loaded-patience-floor-quarter-run"),
        # A steady stream too slow to fill the batch in the window (3 items in 1 s) keeps the latency rule.
        pytest.param(Window(**{**LOADED, "span_s": 1.0}, gap_s=0.01, run_s_next=0.2), 0.01, id="loaded-slow-stream"),
        # ... but an idle arrival under heavy load is held: the first of a burst, whose rate is not known yet.
        pytest.param(Window(**{**LOADED, "span_s": 1.0, "arrived_idle": True}, gap_s=0.01, run_s_next=0.2), 0.1,
                     id="loaded-idle-arrival-holds"),
    ],
)
def test_adaptive_window_waits_only_when_it_can_fill_the_batch_in_budget(window: Window, expected: float) -> None:
    assert adaptive_wait_s(window, max_batch_size=8, max_wait_s=0.15) == pytest.approx(expected)


# Length-aware batches.


def test_similar_sizes_picks_the_least_padded_run_containing_the_oldest() -> None:
    assert similar_sizes([5, 100, 6, 99, 4, 98, 7, 97], 4) == [0, 2, 4, 6]
    assert similar_sizes([90, 1, 2, 3, 100, 95, 99], 3) == [0, 5, 6]


@pytest.mark.parametrize(("policy", "waste"), [("adaptive", 12), ("fixed", 388)])
def test_batcher_groups_similar_lengths_when_more_than_a_batch_waits(
    make_batcher: MakeBatcher, policy: str, waste: int
) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn, policy=policy, max_batch_size=4, max_wait_s=0.0, size_of=len)
    batcher.submit("", soon())
    assert fn.entered.wait(2)
    words = ["a" * n for n in (1, 100, 2, 99, 3, 98, 4, 97)]
    futures = [batcher.submit(word, soon()) for word in words]
    fn.release.set()

    assert [f.result(timeout=2) for f in futures] == [word * 2 for word in words]
    sizes = sorted(sorted(len(word) for word in batch) for batch in fn.batches[1:])
    if policy == "adaptive":
        assert sizes == [[1, 2, 3, 4], [97, 98, 99, 100]]
    assert batcher.stats().padded_waste == waste


# Close, hooks, health.


def test_batcher_close_finishes_in_flight_then_refuses_submit(make_batcher: MakeBatcher) -> None:
    batcher = make_batcher(HeldFn(hold_first=False, run_s=0.05))
    futures = [batcher.submit(i, soon()) for i in range(3)]
    batcher.close(timeout=2)

    assert [f.result(timeout=0) for f in futures] == [0, 2, 4]
    with pytest.raises(BatcherClosed):
        batcher.submit(1, soon())
    assert not batcher.alive()
    assert not batcher.stats().worker_alive


def test_batcher_close_fails_items_it_cannot_finish_in_time(make_batcher: MakeBatcher) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn)
    futures = [batcher.submit(0, soon())]
    assert fn.entered.wait(2)
    futures.append(batcher.submit(1, soon()))
    started = time.monotonic()
    batcher.close(timeout=0.1)

    assert time.monotonic() - started < 1.0
    for future in futures:
        with pytest.raises(BatcherClosed):
            future.result(timeout=0)
    fn.release.set()


def test_batcher_on_batch_hook_gets_size_and_seconds_and_cannot_break_it(make_batcher: MakeBatcher) -> None:
    seen: list[tuple[int, float]] = []

    def hook(report: BatchReport) -> None:
        seen.append((report.size, report.run_s))
        raise RuntimeError("metrics backend down")

    batcher = make_batcher(HeldFn(hold_first=False, run_s=0.01), on_batch=hook)
    assert batcher.submit(3, soon()).result(timeout=2) == 6
    assert batcher.submit(4, soon()).result(timeout=2) == 8
    assert [size for size, _ in seen] == [1, 1]
    assert all(seconds >= 0.01 for _, seconds in seen)


def test_batcher_alive_is_false_while_a_batch_is_stuck(make_batcher: MakeBatcher) -> None:
    fn = HeldFn()
    batcher = make_batcher(fn, stuck_after_s=0.05)
    future = batcher.submit(1, soon())
    assert fn.entered.wait(2)
    assert wait_until(lambda: not batcher.alive())
    assert batcher.stats().running_for_s > 0.05

    fn.release.set()
    assert future.result(timeout=2) == 2
    assert wait_until(batcher.alive)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
        ({"max_in_flight": 0}, "max_in_flight must be >= 1, got 0"),
        ({"max_wait_s": -1}, "max_wait_s must be >= 0, got -1"),
        ({"policy": "eager"}, "policy must be one of"),
    ],
)
def test_batcher_rejects_invalid_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Batcher(lambda xs: xs, **kwargs)
