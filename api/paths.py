"""How an /inference request was answered: the one list of answer paths, read by the log, the metrics and reports.

Every answer is either the model's (`MODEL`), one already computed (`CACHED`, `RETRY_CACHED`), or TOP1 for one of
the reasons below. `api.answers` decides them all, for whichever door takes the request (the worker's event loop or
a view on a thread); `api.admission` names the three checks that keep a question from the model (`POOL_FULL`,
`LATE_ACCEPT`, `SHED`), and the batcher's own bound refuses past them (`OVERLOAD`).
"""

from __future__ import annotations

from enum import StrEnum


class AnswerPath(StrEnum):
    """An answer path: the `path` field of the request log and the `path` / `reason` label of the metrics."""

    MODEL = "model"  # the corrector's answer
    CACHED = "cached"  # a first attempt whose question this replica answered already
    RETRY_CACHED = "retry_cached"  # a retry, with the answer computed for its question by now
    RETRY_TOP1 = "retry_top1"  # a retry without one: TOP1 (a retry never waits for the model)
    TOO_LONG = "too_long"  # TOP1 longer than the model takes
    NO_HAN = "no_han"  # TOP1 without a Han character: nothing the model corrects
    MODEL_LOADING = "model_loading"  # the model is still loading
    LATE_ACCEPT = "late_accept"  # too little of its budget left to wait for a batch
    POOL_FULL = "pool_full"  # the thread pool is full: answered by the event loop
    SHED = "shed"  # the overload control keeps model work down while requests queue
    OVERLOAD = "overload"  # the batcher holds pool_cap questions already (it refused the submit)
    DEADLINE = "deadline"  # the model did not answer within the budget
    ERROR = "error"  # the model failed, answered nothing usable, or failed to load; or a bug on the way

    @property
    def fallback(self) -> bool:
        """Whether the answer is TOP1 instead of an answer of the model's."""
        return self not in _MODEL_ANSWERS

    @property
    def degraded(self) -> bool:
        """Whether TOP1 was answered because something was slow, full or broken (logged as a warning)."""
        return self.fallback and self not in _TOP1_BY_DESIGN

    @property
    def under_load(self) -> bool:
        """Whether TOP1 was answered because the service was past its capacity: thousands a second under overload,
        so their WARNING lines are summed, one a second per path (api.logs.OverloadSums)."""
        return self in _UNDER_LOAD

    @property
    def reason(self) -> str:
        """Why a question took this path, for the request log."""
        return _REASONS[self]


_MODEL_ANSWERS = frozenset({AnswerPath.MODEL, AnswerPath.CACHED, AnswerPath.RETRY_CACHED})
_TOP1_BY_DESIGN = frozenset({AnswerPath.RETRY_TOP1, AnswerPath.TOO_LONG, AnswerPath.NO_HAN})
_UNDER_LOAD = frozenset({AnswerPath.SHED, AnswerPath.POOL_FULL, AnswerPath.OVERLOAD, AnswerPath.LATE_ACCEPT,
                         AnswerPath.DEADLINE})
_REASONS = {
    AnswerPath.MODEL: "the corrector's answer",
    AnswerPath.CACHED: "answered already",
    AnswerPath.RETRY_CACHED: "a retry: the answer computed for it by now",
    AnswerPath.RETRY_TOP1: "a retry with no answer computed yet: TOP1 without the model",
    AnswerPath.TOO_LONG: "TOP1 longer than max_top1_chars",
    AnswerPath.NO_HAN: "TOP1 has no Han character: TOP1 as it is, without the model",
    AnswerPath.MODEL_LOADING: "the model is loading",
    AnswerPath.LATE_ACCEPT: "less than min_model_budget_s of the budget left",
    AnswerPath.POOL_FULL: "the thread pool was full: answered by the event loop",
    AnswerPath.SHED: "overload control: model work shed while requests queue",
    AnswerPath.OVERLOAD: "the batcher held as many questions as it admits (pool_cap)",
    AnswerPath.DEADLINE: "no answer within budget",
    AnswerPath.ERROR: "the model failed",
}
# The metrics' label for a request answered with an error status instead (bad request, body too large, a bug).
REJECTED = "rejected"
