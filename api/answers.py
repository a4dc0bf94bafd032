"""Every answer to /inference, decided in one place for whichever door takes the request.

Two doors take requests: the worker's event loop (`server.worker`), which holds every request whole before a thread
sees it and asks `at_door` first, and the view on a thread (`api.routes.inference`), which asks `in_view`. Both go
through the same rules, in the same order, on the same cache layers, so a request gets the same answer whichever
door takes it:

1. a retry: the answer computed for its question by now, else TOP1 (`retry_cached`, `retry_top1`): a retry means
   the judge already gave up on an earlier attempt, and it never waits for the model;
2. TOP1 over `max_top1_chars` (spaces removed), or TOP1 without a Han character (the model corrects Han characters
   only): TOP1 (`too_long`, `no_han`);
3. a first attempt whose question this replica answered already: that answer (`cached`);
4. the model loading (or the process engine replacing its set of workers), or failed to load: TOP1 (`model_loading`,
   `error`), at once rather than after the budget;
5. admission (`api.admission`): a full thread pool (event loop only), a late accept, or the overload control's
   reduced share of the model: TOP1 (`pool_full`, `late_accept`, `shed`);
6. the model, through the batcher, until the request's deadline: its answer (`model`), else TOP1 (`deadline`,
   `error`, or `overload` when the batcher holds as many questions as it admits).

The event loop answers only when admission would refuse the question (asked first, before the body is even
parsed: it costs a lock) and it can answer alike: it reads the local cache level only (no network call in the
event loop), so a retry it cannot find there, on a replica that shares answers through Redis, is left to a thread.
First attempts look in the local level only, at either door: the shared level holds a first attempt only if the
same first attempt was sent to two replicas, which the judge never does. Anything else (a body that is not a
readable question: the view answers it 400) is left to a thread.

Answers are cached under `cache_key`: the esun_uuid and a digest of TOP1, so that a uuid reused for another question
never gets the old question's answer. A model answer that comes after its request gave up is still stored, so that
the judge's retry gets it; one that comes in time is on the shared level before its response leaves (at most
`SHARED_WRITE_WAIT_S`), so that a retry sent at once to another worker gets it too.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from api.admission import Admission
from api.logs import log_request
from api.metrics import Metrics
from api.paths import AnswerPath
from api.schemas import Question, build_response, read_at_door
from batching import DeadlineExceeded, Overloaded
from cache import LayeredResultCache
from config import Config
from hosting.interfaces import Corrector, Engine, Prediction
from hosting.loading import corrector_loading, corrector_trouble
from preprocess.text import han_chars, has_han, strip_spaces, top1_answer

logger = logging.getLogger("api")

# The longest a model answer's response waits for its write to the shared level (SQLite between workers, Redis
# between replicas), within its deadline: a retry sent the moment the answer arrives, to another worker, finds it.
SHARED_WRITE_WAIT_S = 0.1
# Far above any real sentence (the model sees TOP1s of at most max_top1_chars) and far under the judge's
# 10,240-character response limit.
MAX_ANSWER_CHARS = 1000


@dataclass(frozen=True)
class Outcome:
    """The answer to one request and how it was reached."""

    answer: str
    path: AnswerPath
    batch_size: int | None = None
    reason: str | None = None


def top1_outcome(req: Question, path: AnswerPath, reason: str | None = None, batch_size: int | None = None) -> Outcome:
    """The outcome that answers TOP1 (`top1_answer`: its characters without spaces), always a valid answer."""
    return Outcome(top1_answer(req.sentence_list), path, batch_size, reason or path.reason)


def cache_key(req: Question) -> str:
    """Name a question in the result cache: its esun_uuid and a digest of its TOP1."""
    digest = hashlib.sha256(req.sentence_list[0].encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{req.esun_uuid}#{digest}"


class AnswerPolicy:
    """The rules of the module docstring, over one app's config, cache, corrector, engine and admission."""

    def __init__(self, config: Config, cache: LayeredResultCache, corrector: Corrector | None, engine: Engine,
                 admission: Admission, metrics: Metrics) -> None:
        self._config = config
        self._budget_s = config.budget_s
        self._cache = cache
        self._corrector = corrector
        self._engine = engine
        self._admission = admission
        self._metrics = metrics

    def at_door(self, body: bytes, accepted_at: float) -> bytes | None:
        """The event loop's question: the JSON body of a 200 answer given now, or None: a thread serves it."""
        now = time.monotonic()
        deadline = accepted_at + self._budget_s
        refusal = self._admission.refusal(deadline, now, at_door=True)
        if refusal is None:
            return None
        req = read_at_door(body)
        if req is None:
            return None
        if req.is_retry:
            outcome = self._retry(req, read_shared=False)
            if outcome is None:
                return None
        else:
            outcome = self._first_attempt(req) or top1_outcome(req, refusal)
        response = self.respond(req, outcome, accepted_at)
        return orjson.dumps(response)

    def in_view(self, req: Question, accepted_at: float, view_start: float) -> Outcome:
        """The view's question: answer without the model, or ask the model within the request's budget."""
        self._admission.observe_queued(view_start - accepted_at)
        deadline = accepted_at + self._budget_s
        try:
            outcome = self._retry(req, read_shared=True) if req.is_retry else self._first_attempt(req)
            if outcome is not None:
                return outcome
            refusal = self._admission.refusal(deadline, time.monotonic())
            if refusal is not None:
                return top1_outcome(req, refusal)
            return self._ask_model(req, deadline)
        except Exception as exc:  # a bug on the way: the question is readable, so TOP1 is still a valid answer
            logger.exception("answering %s failed; answering TOP1", req.esun_uuid)
            return top1_outcome(req, AnswerPath.ERROR, reason=f"{type(exc).__name__}: {exc}")

    def respond(self, req: Question, outcome: Outcome, accepted_at: float,
                view_start: float | None = None) -> dict[str, Any]:
        """The judge's four keys for `outcome`; one request log line and the request's metrics."""
        body = build_response(req.esun_uuid, outcome.answer, self._config, now=time.time())
        latency_s = time.monotonic() - accepted_at
        queued_ms = None if view_start is None else (view_start - accepted_at) * 1000
        log_request(req.esun_uuid, req.retry, outcome.path, latency_s * 1000, outcome.batch_size, outcome.reason,
                    queued_ms=queued_ms)
        self._metrics.observe_request(outcome.path, latency_s)
        return body

    def _retry(self, req: Question, read_shared: bool) -> Outcome | None:
        """Rule 1, for a retry. None only when not `read_shared` (the event loop, which makes no network call) and
        the answer may be on the shared level: the door cannot answer alike, a thread does."""
        key = cache_key(req)
        answer = self._cache.get_local(key)
        if answer is None and self._cache.shared is not None:
            if not read_shared:
                return None
            answer = self._cache.get_shared(key)
        return Outcome(answer, AnswerPath.RETRY_CACHED) if answer else top1_outcome(req, AnswerPath.RETRY_TOP1)

    def _first_attempt(self, req: Question) -> Outcome | None:
        """Rules 2-4, for a first attempt; None: the question may go on to admission."""
        if len(strip_spaces(req.sentence_list[0])) > self._config.max_top1_chars:
            return top1_outcome(req, AnswerPath.TOO_LONG)
        if not has_han(req.sentence_list[0]):
            return top1_outcome(req, AnswerPath.NO_HAN)
        cached = self._cache.get_local(cache_key(req))
        if cached:
            return Outcome(cached, AnswerPath.CACHED)
        trouble = corrector_trouble(self._corrector)
        if trouble is not None:
            path = AnswerPath.MODEL_LOADING if corrector_loading(self._corrector) else AnswerPath.ERROR
            return top1_outcome(req, path, reason=trouble)
        if self._engine.loading():
            return top1_outcome(req, AnswerPath.MODEL_LOADING, reason="no model process is ready: a new set is loading")
        return None

    def _ask_model(self, req: Question, deadline: float) -> Outcome:
        """Submit the question to the engine and wait for it until `deadline`; else TOP1."""
        try:
            future = self._engine.submit(req.to_nbest(), deadline)
        except Overloaded:
            return top1_outcome(req, AnswerPath.OVERLOAD, reason="batcher queue is full")
        except Exception as exc:  # BatcherClosed or a bug: still a TOP1 answer on the judge's path
            return top1_outcome(req, AnswerPath.ERROR, reason=f"submit failed: {_describe(exc)}")
        submitted_at = time.monotonic()
        key = cache_key(req)
        future.add_done_callback(partial(_remember, self._cache, key))
        try:
            prediction = future.result(timeout=max(0.0, deadline - submitted_at))
        except (TimeoutError, DeadlineExceeded):
            # An item no batch has started leaves the engine's count now, not at the monitor's next look; one that has
            # started (or was queued to a worker process) cannot be cancelled, and _remember keeps its late answer.
            future.cancel()
            return top1_outcome(req, AnswerPath.DEADLINE)
        except Exception as exc:  # BatchFailed, or the corrector's own error
            return top1_outcome(req, AnswerPath.ERROR, reason=_describe(exc))
        finally:
            self._admission.observe_model_wait(time.monotonic() - submitted_at)
        answer = usable_answer(prediction.answer)
        if answer is None:
            unusable = f"corrector gave an unusable answer: {str(prediction.answer)[:80]!r}"
            return top1_outcome(req, AnswerPath.ERROR, reason=unusable, batch_size=prediction.batch_size)
        # Also stored by _remember, but that callback may run after this thread has answered.
        self._cache.put(key, answer)
        self._cache.wait_shared(key, min(SHARED_WRITE_WAIT_S, max(0.0, deadline - time.monotonic())))
        return Outcome(answer, AnswerPath.MODEL, prediction.batch_size)


def usable_answer(answer: object) -> str | None:
    """Return the answer without spaces if the judge can take it, else None (the caller answers TOP1).

    Usable: a non-empty string of at most MAX_ANSWER_CHARS Han characters (the model is asked only about a TOP1 with
    one: rule 2). Anything else, e.g. Latin letters, control characters or lone surrogates (which would make the
    JSON body unencodable), is refused here, at the model's boundary.
    """
    if not isinstance(answer, str):
        return None
    answer = strip_spaces(answer)
    if not answer or len(answer) > MAX_ANSWER_CHARS or han_chars(answer) != answer:
        return None
    return answer


def _remember(cache: LayeredResultCache, key: str, future: Future[Prediction]) -> None:
    """Store a model answer for the retry, also when its request stopped waiting (runs in the worker)."""
    if future.cancelled() or future.exception() is not None:
        return
    answer = usable_answer(future.result().answer)
    if answer is not None:
        cache.put(key, answer)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    return f"{text} (caused by {type(cause).__name__}: {cause})" if cause is not None else text
