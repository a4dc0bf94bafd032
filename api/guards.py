"""Answers given at once, without the model: each guard returns an `Outcome` or None to pass.

The view tries them in this order, then the model (`api.predict`):

1. `answer_retry`: a retry means the judge already gave up on an earlier attempt; answer it with what was
   computed for its esun_uuid by now, else TOP1. A retry never enters the model queue (contract: that is
   how a slow moment becomes a collapse).
2. `answer_too_long`: a TOP1 over `max_top1_chars` (spaces removed) is answered with TOP1.
3. `answer_cached`: a first attempt whose question was already answered gets the same answer.
4. `api.loading.answer_model_unready`: while the model loads, TOP1 at once (path `model_loading`).
5. `answer_late`: a request accepted so long ago that less than `min_model_budget_s` of its budget is left
   (it waited for a thread) is answered with TOP1 at once, without touching the model (path `late_accept`).

Answers are cached under `cache_key`: the esun_uuid and a digest of TOP1, so that a uuid reused for another
question never gets the old question's answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from api.schemas import InferenceRequest
from cache import ResultCache
from preprocess.text import strip_spaces, top1_answer


@dataclass(frozen=True)
class Outcome:
    """The answer to one request and how it was reached (the `path` of the request log)."""

    answer: str
    path: str
    batch_size: int | None = None
    reason: str | None = None


def top1(req: InferenceRequest, path: str, reason: str | None = None, batch_size: int | None = None) -> Outcome:
    """Answer with TOP1 (its Han characters), always a valid answer."""
    return Outcome(top1_answer(req.sentence_list), path, batch_size, reason)


def cache_key(req: InferenceRequest) -> str:
    """Name a question in the result cache: its esun_uuid and a digest of its TOP1."""
    digest = hashlib.sha256(req.sentence_list[0].encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{req.esun_uuid}#{digest}"


def answer_retry(req: InferenceRequest, cache: ResultCache) -> Outcome | None:
    """Answer a retry from the cache, else with TOP1; pass a first attempt."""
    if not req.is_retry:
        return None
    cached = cache.get(cache_key(req))
    return Outcome(cached, "retry_cached") if cached else top1(req, "retry_top1")


def answer_too_long(req: InferenceRequest, max_top1_chars: int) -> Outcome | None:
    """Answer with TOP1 when TOP1 is longer than the model takes; pass the rest."""
    if len(strip_spaces(req.sentence_list[0])) > max_top1_chars:
        return top1(req, "too_long")
    return None


def answer_late(req: InferenceRequest, deadline: float, min_model_budget_s: float, now: float) -> Outcome | None:
    """Answer with TOP1 when less than `min_model_budget_s` is left before `deadline`; pass the rest."""
    left_s = deadline - now
    if left_s < min_model_budget_s:
        return top1(req, "late_accept", reason=f"{left_s * 1000:.0f} ms of the budget left when the view started")
    return None


def answer_cached(req: InferenceRequest, cache: ResultCache) -> Outcome | None:
    """Answer a question already answered with the same answer; pass a new one."""
    cached = cache.get(cache_key(req))
    return Outcome(cached, "cached") if cached else None
