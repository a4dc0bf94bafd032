"""Tests of sidecar.heap: the batch workers give the C heap's free memory back at most once per interval."""

from __future__ import annotations

import platform
import time

import pytest

from batching import Batcher
from sidecar import heap
from sidecar.heap import HeapTrimmer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counter:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self._error = error

    def __call__(self) -> int:
        self.calls += 1
        if self._error is not None:
            raise self._error
        return 1


def test_the_first_batch_trims_then_at_most_once_per_interval() -> None:
    clock, trim = Clock(), Counter()
    trimmer = HeapTrimmer(every_s=30.0, trim=trim, clock=clock)
    trimmer.after_batch()
    for _ in range(100):  # a busy half minute: batches back to back
        clock.now += 0.29
        trimmer.after_batch()
    assert trim.calls == 1
    clock.now += 1.0
    trimmer.after_batch()
    assert trim.calls == trimmer.trims == 2


def test_a_trim_that_fails_is_not_the_batchs_failure() -> None:
    trimmer = HeapTrimmer(trim=Counter(OSError("no")), clock=Clock())
    trimmer.after_batch()  # must not raise
    assert trimmer.trims == 0


def test_without_malloc_trim_in_the_c_library_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "malloc_trim", None)
    trimmer = HeapTrimmer(every_s=0.0)
    trimmer.after_batch()
    assert trimmer.trims == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_malloc_trim_is_found_and_runs() -> None:
    assert heap.malloc_trim is not None
    assert heap.malloc_trim() in (0, 1)  # 1: memory was released, 0: there was none to release


def test_the_threaded_batcher_trims_after_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    trim = Counter()
    monkeypatch.setattr(heap, "malloc_trim", trim)
    batcher: Batcher[int, int] = Batcher(lambda xs: [x + 1 for x in xs], max_wait_s=0.01)
    try:
        assert trim.calls == 0  # nothing before a batch has run
        assert batcher.submit(1, time.monotonic() + 5).result(timeout=5) == 2
        deadline = time.monotonic() + 5
        while trim.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trim.calls == 1
        assert batcher.submit(2, time.monotonic() + 5).result(timeout=5) == 3
        time.sleep(0.05)
        assert trim.calls == 1  # the next batch is within the interval
    finally:
        batcher.close(timeout=0.5)
