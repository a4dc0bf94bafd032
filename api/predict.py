"""The model's answer to a request, within the request's budget, else TOP1.

`answer_with_model` submits one question to the engine and waits for it until its deadline. Whatever goes wrong
on the way (model work shed by the overload control, queue full, deadline passed, the corrector failing or
answering nothing) the request still gets TOP1 with a 200, and the `Outcome` says why. An answer that comes
back after its request gave up is still stored, so that the judge's retry gets it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from functools import partial

from api.guards import Outcome, cache_key, top1
from api.interfaces import Engine, Prediction
from api.overload import OverloadControl
from api.schemas import InferenceRequest
from batching import DeadlineExceeded, Overloaded
from cache import ResultCache
from preprocess.text import han_only, strip_spaces, top1_answer

# Far above any real sentence (the model sees TOP1s of at most max_top1_chars) and far under the judge's
# 10,240-character response limit.
MAX_ANSWER_CHARS = 1000


def answer_with_model(
    req: InferenceRequest, batcher: Engine, cache: ResultCache, deadline: float, overload: OverloadControl
) -> Outcome:
    """Ask the model through the batcher, waiting until `deadline` (time.monotonic); else answer TOP1.

    The overload control admits the request first: while requests queue before their view or on the model, it
    answers TOP1 at once (path `shed`) so that the CPU goes to draining those queues, and hears how long each
    admitted request waited on the model (api.overload).
    """
    if not overload.admit():
        return top1(req, "shed", reason="overload control: model work shed while requests queue")
    admitted_at = time.monotonic()
    try:
        return _ask_model(req, batcher, cache, deadline)
    finally:
        overload.release(time.monotonic() - admitted_at)


def _ask_model(req: InferenceRequest, batcher: Engine, cache: ResultCache, deadline: float) -> Outcome:
    try:
        future = batcher.submit(req.to_nbest(), deadline)
    except Overloaded:
        return top1(req, "overload", reason="batcher queue is full")
    except Exception as exc:  # BatcherClosed or a bug: still a TOP1 answer on the judge's path
        return top1(req, "error", reason=f"submit failed: {_describe(exc)}")
    key, top1_text = cache_key(req), top1_answer(req.sentence_list)
    future.add_done_callback(partial(_remember, cache, key, top1_text))
    try:
        prediction = future.result(timeout=max(0.0, deadline - time.monotonic()))
    except (TimeoutError, DeadlineExceeded):
        return top1(req, "deadline", reason="no answer within budget")
    except Exception as exc:  # BatchFailed, or the corrector's own error
        return top1(req, "error", reason=_describe(exc))
    answer = usable_answer(prediction.answer, top1_text)
    if answer is None:
        return top1(req, "error", reason=f"corrector gave an unusable answer: {str(prediction.answer)[:80]!r}",
                    batch_size=prediction.batch_size)
    # Also stored by _remember, but that callback may run after this thread has answered.
    cache.put(key, answer)
    return Outcome(answer, "model", prediction.batch_size)


def usable_answer(answer: object, top1_text: str) -> str | None:
    """Return the answer without spaces if the judge can take it, else None (the caller answers TOP1).

    Usable: a non-empty string of at most MAX_ANSWER_CHARS Han characters, or TOP1's own answer (which keeps a
    hypothesis with no Han character as it is). Anything else, e.g. Latin letters, control characters or lone
    surrogates (which would make the JSON body unencodable), is refused here, at the model's boundary.
    """
    if not isinstance(answer, str):
        return None
    answer = strip_spaces(answer)
    if answer and answer == top1_text:
        return answer
    if not answer or len(answer) > MAX_ANSWER_CHARS or han_only(answer) != answer:
        return None
    return answer


def _remember(cache: ResultCache, key: str, top1_text: str, future: Future[Prediction]) -> None:
    """Store a model answer for the retry, also when its request stopped waiting (runs in the worker)."""
    if future.cancelled() or future.exception() is not None:
        return
    answer = usable_answer(future.result().answer, top1_text)
    if answer is not None:
        cache.put(key, answer)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    return f"{text} (caused by {type(cause).__name__}: {cause})" if cause is not None else text
