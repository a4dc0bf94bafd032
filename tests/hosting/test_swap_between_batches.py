"""The threaded engine switches models between batches: a batch runs wholly on the model it started on, a swap
waits for it, and every batch started after the swap runs on the new model (hosting.loading.LoadingCorrector.replace,
under the real Batcher)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from batching import Batcher
from hosting.interfaces import Prediction, batch_fn
from hosting.loading import LoadingCorrector
from preprocess.text import NBest
from tests.fakes import FakeCorrector


def marked(mark: str, gate: threading.Event | None = None, delay_s: float = 0.0) -> FakeCorrector:
    """A fake whose answers all start with `mark`."""
    return FakeCorrector(gate=gate, delay_s=delay_s, answer=lambda item: mark + item.top1)


def engine_on(corrector: FakeCorrector) -> tuple[LoadingCorrector, Batcher[NBest, Prediction]]:
    loader = LoadingCorrector(lambda: corrector)
    loader.setup()
    return loader, Batcher(batch_fn(loader), max_batch_size=8, max_wait_s=0.005, name="swap-test")


def ask(batcher: Batcher[NBest, Prediction], text: str) -> Future[Prediction]:
    return batcher.submit(NBest((text,)), time.monotonic() + 10)


def test_a_swap_waits_for_the_running_batch_which_ends_on_the_old_model():
    gate = threading.Event()
    old, new = marked("甲", gate=gate), marked("乙")
    loader, batcher = engine_on(old)
    with batcher:
        running = [ask(batcher, f"問{i}") for i in range(3)]
        assert old.started.wait(5)
        result: list[tuple[object, bool]] = []
        swap = threading.Thread(target=lambda: result.append(loader.replace(new, wait_s=5)))
        swap.start()
        time.sleep(0.1)
        assert swap.is_alive()  # the batch on the old model still runs

        gate.set()
        swap.join(5)
        after = [ask(batcher, f"後{i}") for i in range(3)]

        assert [f.result(5).answer[0] for f in running] == ["甲"] * 3
        assert [f.result(5).answer[0] for f in after] == ["乙"] * 3
        assert result == [(old, True)]


def test_under_a_stream_of_questions_no_batch_mixes_the_two_models():
    old, new = marked("甲", delay_s=0.003), marked("乙", delay_s=0.003)
    loader, batcher = engine_on(old)
    futures: list[tuple[Future[Prediction], bool]] = []  # (future, asked after the swap had returned)
    swapped = threading.Event()
    stop = threading.Event()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            after = swapped.is_set()
            futures.append((ask(batcher, f"第{n}問{i}"), after))
            futures[-1][0].result(5)
            i += 1

    with batcher:
        clients = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for c in clients:
            c.start()
        time.sleep(0.2)
        loader.replace(new, wait_s=5)
        swapped.set()
        time.sleep(0.2)
        stop.set()
        for c in clients:
            c.join(5)

    assert old.batches and new.batches  # the swap came while questions streamed
    by_question = {item.top1: "甲" for batch in old.batches for item in batch}
    by_question |= {item.top1: "乙" for batch in new.batches for item in batch}
    for future, after in futures:
        prediction = future.result()
        assert prediction.answer[0] == by_question[prediction.answer[1:]]  # its batch's model answered it
        if after:
            assert prediction.answer[0] == "乙"
    assert not {i.top1 for b in old.batches for i in b} & {i.top1 for b in new.batches for i in b}
