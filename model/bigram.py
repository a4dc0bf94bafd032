"""The character-bigram language model behind the candidates' LM columns (`lm_delta` and the two edge counts).

log P(b | a) = log(count(ab) + prior(b)) - log_den(a), the bigram estimate smoothed towards the unigram one:
prior(b) = PRIOR_WEIGHT * (count(b) + 1) / (total + n_types) and log_den(a) = log(count(a) + PRIOR_WEIGHT). The
model is tables computed once, by `BigramLM.__init__`, and read by two methods alone: `follow` (a character's
bigrams with those after it) and `precede` (with those before it), which every path of the featurizer calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import cython

from model.contract import LM_DELTA_CLIP, LM_DELTA_SCALE

if TYPE_CHECKING:
    import numpy as np

# How many counts' worth of the unigram estimate a bigram's estimate is smoothed towards.
PRIOR_WEIGHT = 5.0
# A bigram's two terms: log(count + prior(b)), the numerator's log, and log1p(count), its edge count (0 unseen).
Seen = tuple[float, float]
_NONE_SEEN: dict[str, Seen] = {}


class BigramLM:
    """The smoothed character-bigram model of a vocabulary's counts, as tables read by `follow` and `precede` alone.

    `_log_prior[b]` (`_log_prior_unk` for an unknown b) is an unseen bigram's numerator, `_log_den[a]`
    (`_log_den_unk`) every bigram's denominator after a; a seen bigram's numerator and edge count are `_after[a][b]`,
    or `_before[b][a]`.
    """

    def __init__(self, counts: dict[str, int], bigrams: dict[str, int], total: int, n_types: int) -> None:
        prior = {c: PRIOR_WEIGHT * (n + 1) / (total + n_types) for c, n in counts.items()}
        prior_unk = PRIOR_WEIGHT / (total + n_types)
        self._log_prior = {c: math.log(p) for c, p in prior.items()}
        self._log_prior_unk = math.log(prior_unk)
        self._log_den = {c: math.log(n + PRIOR_WEIGHT) for c, n in counts.items()}
        self._log_den_unk = math.log(PRIOR_WEIGHT)
        self._after: dict[str, dict[str, Seen]] = {}
        self._before: dict[str, dict[str, Seen]] = {}
        for pair, n in bigrams.items():
            a, b = pair[0], pair[1]
            seen = (math.log(n + prior.get(b, prior_unk)), math.log1p(n))
            self._after.setdefault(a, {})[b] = seen
            self._before.setdefault(b, {})[a] = seen

    # typed for the C compiler (compiled.py): the tables' lookups become direct dict calls, the terms C doubles (the
    # same IEEE subtractions)
    @cython.locals(after=dict, log_prior=dict, den=cython.double, unseen=cython.double, terms=list, edges=list,
                   seen=tuple)
    def follow(self, a: str, bs: Sequence[str]) -> tuple[list[float], list[float]]:
        """log P(b | a) of each character b of `bs`, and each bigram's edge count log1p(count(ab)) (0.0 unseen).

        One call per position and side (what depends on `a` looked up once): a segment of another length than one
        gets a meaningless term, which its caller replaces by `score`'s."""
        after = self._after.get(a, _NONE_SEEN)
        den, log_prior, log_prior_unk = self._log_den.get(a, self._log_den_unk), self._log_prior, self._log_prior_unk
        terms, edges = [], []
        for b in bs:  # a loop, not comprehensions: each of those is a call of its own (Python 3.11)
            seen = after.get(b)
            if seen is None:
                unseen = log_prior.get(b, log_prior_unk)
                terms.append(unseen - den)
                edges.append(0.0)
            else:
                terms.append(seen[0] - den)
                edges.append(seen[1])
        return terms, edges

    @cython.locals(before=dict, log_den=dict, den=cython.double, unseen=cython.double, terms=list, edges=list,
                   seen=tuple)
    def precede(self, bs: Sequence[str], c: str) -> tuple[list[float], list[float]]:
        """log P(c | b) of each character b of `bs`, and each bigram's edge count log1p(count(bc)) (0.0 unseen); as
        `follow`, with `c`'s lookups once."""
        before = self._before.get(c, _NONE_SEEN)
        unseen, log_den, log_den_unk = self._log_prior.get(c, self._log_prior_unk), self._log_den, self._log_den_unk
        terms, edges = [], []
        for b in bs:
            seen = before.get(b)
            den = log_den.get(b, log_den_unk)
            if seen is None:
                terms.append(unseen - den)
                edges.append(0.0)
            else:
                terms.append(seen[0] - den)
                edges.append(seen[1])
        return terms, edges

    def score(self, text: str) -> tuple[float, float, float]:
        """log P(text) given its first character, summed left to right, and its first and last bigrams' edge counts."""
        score = first = last = 0.0
        for k in range(len(text) - 1):
            (term,), (last,) = self.follow(text[k], text[k + 1])
            if k == 0:
                first = last
            score += term
        return score, first, last


Delta = TypeVar("Delta", float, "np.ndarray")


def lm_delta(candidate_minus_keep: Delta) -> Delta:
    """The lm_delta column: the bigram LM's log probability of TOP1's neighbours with a candidate in place, minus
    the same with keep (`candidate_minus_keep`), scaled by LM_DELTA_SCALE and clipped to [-LM_DELTA_CLIP,
    LM_DELTA_CLIP]. Of one float (the general path, `model.features`: by comparisons, cheaper than np.clip on one
    number) or of a numpy array (the unanimous rows, `model.unanimous`: one clip for the batch)."""
    delta = candidate_minus_keep / LM_DELTA_SCALE
    if isinstance(delta, float):
        return LM_DELTA_CLIP if delta > LM_DELTA_CLIP else -LM_DELTA_CLIP if delta < -LM_DELTA_CLIP else delta
    return delta.clip(-LM_DELTA_CLIP, LM_DELTA_CLIP)
