"""The character-bigram language model behind the candidates' LM columns (`lm_delta` and the two edge counts).

log P(b | a) = log(count(ab) + prior(b)) - log_den(a), the bigram estimate smoothed towards the unigram one:
prior(b) = PRIOR_WEIGHT * (count(b) + 1) / (total + n_types) and log_den(a) = log(count(a) + PRIOR_WEIGHT). The
model is tables computed once, by `BigramLM.__init__`, and read by two methods alone: `follow` (a character's
bigrams with those after it) and `precede` (with those before it), which every path of the featurizer calls.

The tables are arrays by character id (a character's code point gives its id): each character's log prior and log
denominator, and the seen bigrams in one open-addressing hash table (linear probing, at most half full) of their
numerator's log and edge count. A batch of new lists asks about 15,000 bigrams (issue 61); as dictionaries of
strings, their look-ups were a quarter of featurizing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import cython
import numpy as np

from model.contract import LM_DELTA_CLIP, LM_DELTA_SCALE

if TYPE_CHECKING:
    import numpy.typing as npt

# How many counts' worth of the unigram estimate a bigram's estimate is smoothed towards.
PRIOR_WEIGHT = 5.0
# The pair table's slot of (a, b) starts at (a * _HASH_A + b * _HASH_B) & mask: odd multipliers, exact in 64 bits for
# ids under 2**16 (the vocabularies hold a few thousand characters), so Python and C find the same slot.
_HASH_A = cython.declare(cython.longlong, 40_503)
_HASH_B = cython.declare(cython.longlong, 2_654_435_761)
MAX_IDS = 1 << 16


@cython.final
@cython.cclass
class BigramLM:
    """The smoothed character-bigram model of a vocabulary's counts, as tables read by `follow` and `precede` alone.

    `_ids[ord(c)]` is a character's id (-1: none); `_log_prior[id]` (`_log_prior_unk` without an id) is an unseen
    bigram's numerator, `_log_den[id]` (`_log_den_unk`) every bigram's denominator after the character; a seen
    bigram (a, b) holds the slot of `_keys` equal to `a * n_ids + b + 1` (0: an empty slot), and its numerator and
    edge count are `_seen_num` and `_seen_edge` there.
    """

    # typed for the C compiler (compiled.py): typed views held by the object, read without a Python object per look-up
    _ids: cython.int[:]
    _log_prior: cython.double[:]
    _log_den: cython.double[:]
    _keys: cython.longlong[:]
    _seen_num: cython.double[:]
    _seen_edge: cython.double[:]
    _log_prior_unk: cython.double
    _log_den_unk: cython.double
    _n_ids: cython.longlong
    _mask: cython.longlong

    def __init__(self, counts: dict[str, int], bigrams: dict[str, int], total: int, n_types: int) -> None:
        chars = sorted({*counts, *(c for pair in bigrams for c in pair)})
        if any(len(c) != 1 for c in chars) or any(len(pair) != 2 for pair in bigrams) or len(chars) >= MAX_IDS:
            raise ValueError(f"a character-bigram model needs single characters and pairs of them, under {MAX_IDS}")
        index = {c: i for i, c in enumerate(chars)}
        ids = np.full(max(map(ord, chars), default=0) + 1, -1, np.int32)
        ids[[ord(c) for c in chars]] = np.arange(len(chars), dtype=np.int32)
        prior = {c: PRIOR_WEIGHT * (n + 1) / (total + n_types) for c, n in counts.items()}
        prior_unk = PRIOR_WEIGHT / (total + n_types)
        self._log_prior_unk = math.log(prior_unk)
        self._log_den_unk = math.log(PRIOR_WEIGHT)
        log_prior = [math.log(prior[c]) if c in prior else self._log_prior_unk for c in chars]
        log_den = [math.log(counts[c] + PRIOR_WEIGHT) if c in counts else self._log_den_unk for c in chars]
        firsts = np.array([index[pair[0]] for pair in bigrams], np.int64)
        seconds = np.array([index[pair[1]] for pair in bigrams], np.int64)
        nums = [math.log(n + prior.get(pair[1], prior_unk)) for pair, n in bigrams.items()]
        edges = [math.log1p(n) for n in bigrams.values()]
        keys, num, edge = _pair_table(firsts, seconds, len(chars), np.array(nums), np.array(edges))
        self._n_ids, self._mask = len(chars), len(keys) - 1
        self._ids, self._log_prior, self._log_den = _view(ids), _view(np.array(log_prior)), _view(np.array(log_den))
        self._keys, self._seen_num, self._seen_edge = _view(keys), _view(num), _view(edge)

    def follow(self, a: str, bs: Sequence[str]) -> tuple[list[float], list[float]]:
        """log P(b | a) of each character b of `bs`, and each bigram's edge count log1p(count(ab)) (0.0 unseen).

        One call per position and side (what depends on `a` looked up once): a segment of another length than one
        gets a meaningless term, which its caller replaces by `score`'s."""
        return self._bigrams(a, bs, True)

    def precede(self, bs: Sequence[str], c: str) -> tuple[list[float], list[float]]:
        """log P(c | b) of each character b of `bs`, and each bigram's edge count log1p(count(bc)) (0.0 unseen); as
        `follow`, with `c`'s look-ups once."""
        return self._bigrams(c, bs, False)

    # typed for the C compiler: one loop for both sides, the look-ups written out in it (interpreted, a method call
    # per candidate cost more than the arrays saved)
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(given_first=cython.bint, given=cython.longlong, other=cython.longlong, first=cython.longlong,
                   second=cython.longlong, key=cython.longlong, slot=cython.longlong, held=cython.longlong,
                   code=cython.Py_ssize_t, n_codes=cython.Py_ssize_t, n_ids=cython.longlong, mask=cython.longlong,
                   fixed=cython.double, den=cython.double, unseen=cython.double, terms=list, edges=list,
                   ids=cython.int[:], keys=cython.longlong[:], log_prior=cython.double[:], log_den=cython.double[:])
    def _bigrams(self, char: str, bs: Sequence[str], given_first: bool) -> tuple[list[float], list[float]]:
        """The terms and edge counts of the bigrams (char, b) for each b of `bs` where `given_first`, else (b, char)."""
        ids, keys, log_prior, log_den = self._ids, self._keys, self._log_prior, self._log_den
        n_codes, n_ids, mask = len(ids), self._n_ids, self._mask
        code = ord(char) if len(char) == 1 else n_codes
        given = ids[code] if code < n_codes else -1
        if given_first:  # follow: char's denominator for all
            fixed = log_den[given] if given >= 0 else self._log_den_unk
        else:  # precede: char's prior for all
            fixed = log_prior[given] if given >= 0 else self._log_prior_unk
        terms, edges = [], []
        for b in bs:  # a loop, not comprehensions: each of those is a call of its own (Python 3.11)
            code = ord(b) if len(b) == 1 else n_codes
            other = ids[code] if code < n_codes else -1
            if given_first:
                first, second = given, other
                den = fixed
                unseen = log_prior[other] if other >= 0 else self._log_prior_unk
            else:
                first, second = other, given
                den = log_den[other] if other >= 0 else self._log_den_unk
                unseen = fixed
            slot = -1
            if first >= 0 and second >= 0:  # the pair table's slot of (first, second), -1 where never seen
                key = first * n_ids + second + 1
                slot = (first * _HASH_A + second * _HASH_B) & mask
                held = keys[slot]
                while held != key:
                    if held == 0:
                        slot = -1
                        break
                    slot = (slot + 1) & mask
                    held = keys[slot]
            if slot < 0:
                terms.append(unseen - den)
                edges.append(0.0)
            else:
                terms.append(self._seen_num[slot] - den)
                edges.append(self._seen_edge[slot])
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


def _pair_table(firsts: npt.NDArray[np.int64], seconds: npt.NDArray[np.int64], n_ids: int, nums: np.ndarray,
                edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seen bigrams (ids `firsts`, `seconds`) in an open-addressing table at most half full: keys (`first *
    n_ids + second + 1`, 0 empty), numerators and edge counts by slot. Placed round by round: each pair still
    unplaced tries its start slot plus the round, the first of those that find a slot free takes it, so every slot
    a pair's look-up passes before its own is taken (`BigramLM._bigrams` stops at the first empty one)."""
    size = 1 << max(4, (2 * len(firsts)).bit_length())
    mask = size - 1
    keys, num, edge = np.zeros(size, np.int64), np.zeros(size), np.zeros(size)
    start = (firsts * _HASH_A + seconds * _HASH_B) & mask
    pending = np.arange(len(firsts))
    step = 0
    while len(pending):
        slots = (start[pending] + step) & mask
        free = keys[slots] == 0
        taken, first = np.unique(slots[free], return_index=True)
        placed = pending[free][first]
        keys[taken] = firsts[placed] * n_ids + seconds[placed] + 1
        num[taken], edge[taken] = nums[placed], edges[placed]
        pending = np.setdiff1d(pending, placed, assume_unique=True)
        step += 1
    return keys, num, edge


def _view(array: np.ndarray) -> Any:
    """A table as the methods read it: the array itself, compiled (a typed view of it), or a list, interpreted (its
    items read as Python numbers, as fast as the dictionaries were, not as numpy scalars)."""
    return array if cython.compiled else array.tolist()


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
