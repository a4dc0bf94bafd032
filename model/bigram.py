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

    # typed for the C compiler: the look-ups C functions inlined into the loops below (interpreted, plain methods)
    @cython.cfunc
    @cython.inline
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(code=cython.Py_ssize_t, n_codes=cython.Py_ssize_t)
    def _id(self, char: str) -> cython.longlong:
        """A character's id; -1 for a segment of another length or a character never counted."""
        n_codes = len(self._ids)
        code = ord(char) if len(char) == 1 else n_codes
        return self._ids[code] if code < n_codes else -1

    @cython.cfunc
    @cython.inline
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(key=cython.longlong, slot=cython.longlong, held=cython.longlong)
    def _slot(self, first: cython.longlong, second: cython.longlong) -> cython.longlong:
        """The pair table's slot of the bigram (first, second); -1 where it was never seen (or either has no id)."""
        if first < 0 or second < 0:
            return -1
        key = first * self._n_ids + second + 1
        slot = (first * _HASH_A + second * _HASH_B) & self._mask
        held = self._keys[slot]
        while held != key:
            if held == 0:
                return -1
            slot = (slot + 1) & self._mask
            held = self._keys[slot]
        return slot

    @cython.cfunc
    @cython.inline
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _prior(self, char_id: cython.longlong) -> cython.double:
        return self._log_prior[char_id] if char_id >= 0 else self._log_prior_unk

    @cython.cfunc
    @cython.inline
    @cython.boundscheck(False)
    @cython.wraparound(False)
    def _den(self, char_id: cython.longlong) -> cython.double:
        return self._log_den[char_id] if char_id >= 0 else self._log_den_unk

    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(given_first=cython.bint, given=cython.longlong, other=cython.longlong, slot=cython.longlong,
                   fixed=cython.double, den=cython.double, unseen=cython.double, terms=list, edges=list)
    def _bigrams(self, char: str, bs: Sequence[str], given_first: bool) -> tuple[list[float], list[float]]:
        """The terms and edge counts of the bigrams (char, b) for each b of `bs` where `given_first`, else (b, char)."""
        given = self._id(char)
        # follow: char's denominator for all; precede: char's prior for all
        fixed = self._den(given) if given_first else self._prior(given)
        terms, edges = [], []
        for b in bs:  # a loop, not comprehensions: each of those is a call of its own (Python 3.11)
            other = self._id(b)
            if given_first:
                den, unseen = fixed, self._prior(other)
                slot = self._slot(given, other)
            else:
                den, unseen = self._den(other), fixed
                slot = self._slot(other, given)
            if slot < 0:
                terms.append(unseen - den)
                edges.append(0.0)
            else:
                terms.append(self._seen_num[slot] - den)
                edges.append(self._seen_edge[slot])
        return terms, edges

    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(n=cython.Py_ssize_t, k=cython.Py_ssize_t, left=cython.longlong, right=cython.longlong,
                   b=cython.longlong, slot=cython.longlong, den_left=cython.double, prior_right=cython.double,
                   den=cython.double, cands=list, out=cython.double[:, :, :])
    def sides(self, lefts: list[str], cands_of: list[list[str]], rights: list[str], out: np.ndarray) -> None:
        """For each n, each character cands_of[n][k]'s bigrams with its neighbours, written into `out` ([N, 4, C]
        float64): out[n, 0, k] and out[n, 1, k] what `follow(lefts[n], ...)` gives it, out[n, 2, k] and out[n, 3, k]
        what `precede(..., rights[n])` does (the same floats); past its candidates `out` is left as it is. Many
        positions in one call, no Python object per bigram (`model.unanimous`)."""
        for n in range(len(lefts)):
            left, right = self._id(lefts[n]), self._id(rights[n])
            den_left, prior_right = self._den(left), self._prior(right)
            cands = cands_of[n]
            for k in range(len(cands)):
                b = self._id(cands[k])
                slot = self._slot(left, b)
                if slot < 0:
                    out[n, 0, k] = self._prior(b) - den_left
                    out[n, 1, k] = 0.0
                else:
                    out[n, 0, k] = self._seen_num[slot] - den_left
                    out[n, 1, k] = self._seen_edge[slot]
                den = self._den(b)
                slot = self._slot(b, right)
                if slot < 0:
                    out[n, 2, k] = prior_right - den
                    out[n, 3, k] = 0.0
                else:
                    out[n, 2, k] = self._seen_num[slot] - den
                    out[n, 3, k] = self._seen_edge[slot]

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
