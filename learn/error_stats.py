"""Aggregate error statistics of a recogniser's TOP1 against the truths: `python -m learn.data.standin --stats FILE`.

Everything is measured on the Han characters only (`han_chars` of TOP1 and of the truth), as the judge scores.

- **TOP1 right**: share of lists whose TOP1 equals the truth.
- **TOP1 CER**, pooled: the sum over lists of Levenshtein(TOP1, truth) / the sum of the truths' lengths.
- **truth length**: mean characters of a truth.
- **one span**: among the lists with a wrong TOP1, the share whose TOP1 differs from the truth in exactly one span.
- **spans**: `preprocess.rules.edit_spans(top1, truth)`, adjacent Levenshtein edits merged; a span rewrites the
  recogniser's `source` (in TOP1) into the truth's `target`. Each span gets one class, the first that matches:
  1. `filler`: source or target made only of `SPOKEN_FILLERS` and the other side too, or empty (痾 → 呃, 呃 → 嗯,
     a dropped 呃, an added 嗯);
  2. `variant`: same length, equal once each character is converted by OpenCC `t2s` (週 → 周, 佈 → 布, 台 → 臺);
  3. `homophone`: same length, every character's toneless syllable equal (`phones.char_syllable`);
  4. `near`: same length, every character's toneless syllable equal or one near swap away
     (`confusion.near_toneless`: n/ng, retroflex, ...);
  5. `other`: any other same-length substitution (sounds differ beyond tone);
  6. `added`: the recogniser added a word (target empty);
  7. `dropped`: the recogniser dropped one (source empty);
  8. `other_length`: a span of one length written as one of another.
  A class's share of **spans** counts spans; its share of **error characters** weights each span by
  max(len(source), len(target)) (the edits a merged span costs, as Levenshtein pairs substitutions first).
- **rewrites**: a span's key is (source, target). Distinct keys, those seen twice or more and three times or
  more, and the share of all spans that the 30 most frequent keys hold. Distinct keys grow with the file's size,
  more slowly than spans do, so the table also gives them per 1,000 spans and, for a file of at least
  `REAL_LISTS` lists, over its first `REAL_LISTS` lists (the size of the real figures).
- **against** another file: the share of the other file's spans whose key is seen in this file (and seen there
  at least twice); again also over this file's first `REAL_LISTS` lists and the other's first `REAL_HELD_OUT`.

Pure: strings in, a frozen dataclass out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from rapidfuzz.distance import Levenshtein

from preprocess.confusion import near_toneless
from preprocess.phones import char_syllable
from preprocess.rules import edit_spans
from preprocess.text import SPOKEN_FILLERS, han_chars

SPAN_CLASSES = ("filler", "variant", "homophone", "near", "other", "added", "dropped", "other_length")
REAL_LISTS = 2562  # the real figures' file: distinct rewrites are compared at this size
REAL_HELD_OUT = 1000  # the real figures' held-out lists (seen-in-train share)
TOP_REWRITES = 30


@dataclass(frozen=True)
class RealHardness:
    """The hardness measures of the real lists (issue 39: 2,562 lists, 1,000 held out; `learn.memo_baseline`)."""

    lm_prefers_truth: float
    lm_chars_prefers_truth: float
    rate_quartiles: tuple[float, float, float]
    rate_share_half: float
    memo_cer_change: dict[float, float]
    memo_worse: dict[float, int]


REAL_HARDNESS = RealHardness(0.607, 0.640, (0.03, 0.13, 0.50), 0.28, {0.0: -0.044, 2.0: -0.034}, {0.0: 10, 2.0: 3})


@lru_cache(maxsize=1)
def _t2s():
    import opencc  # a pure package (no torch): fine in preprocess/

    return opencc.OpenCC("t2s")


@lru_cache(maxsize=65536)
def simplified(char: str) -> str:
    """One character converted by OpenCC t2s (character by character, so lengths are kept)."""
    return _t2s().convert(char)[:1] or char


def _toneless(char: str) -> str | None:
    syl = char_syllable(char)
    return None if syl is None else syl.toneless


def _near(a: str, b: str) -> bool:
    sa, sb = char_syllable(a), char_syllable(b)
    if sa is None or sb is None:
        return False
    return sa.toneless == sb.toneless or sb.toneless in near_toneless(sa)


def _fillers(text: str) -> bool:
    return bool(text) and all(c in SPOKEN_FILLERS for c in text)


def classify_span(source: str, target: str) -> str:
    """Name the class of one span that rewrites TOP1's `source` into the truth's `target` (first match wins)."""
    if (_fillers(source) or not source) and (_fillers(target) or not target):
        return "filler"
    if len(source) == len(target):
        if all(simplified(a) == simplified(b) for a, b in zip(source, target, strict=True)):
            return "variant"
        tl = [(_toneless(a), _toneless(b)) for a, b in zip(source, target, strict=True)]
        if all(a is not None and a == b for a, b in tl):
            return "homophone"
        if all(_near(a, b) for a, b in zip(source, target, strict=True)):
            return "near"
        return "other"
    if not target:
        return "added"
    if not source:
        return "dropped"
    return "other_length"


def span_keys(top1: str, truth: str) -> list[tuple[str, str]]:
    """The (source, target) rewrites of one list's spans."""
    return [(s.source, s.target) for s in edit_spans(top1, truth)]


@dataclass(frozen=True)
class Rewrites:
    """How a file's span rewrites repeat."""

    spans: int
    distinct: int
    twice: int  # distinct keys seen at least twice
    thrice: int  # ... at least three times
    top_share: float  # share of spans held by the TOP_REWRITES most frequent keys

    @property
    def distinct_per_1000(self) -> float:
        return 1000 * self.distinct / max(self.spans, 1)


def rewrites(keys: Counter[tuple[str, str]]) -> Rewrites:
    """Summarise a count of span keys."""
    spans = sum(keys.values())
    top = sum(n for _, n in keys.most_common(TOP_REWRITES))
    return Rewrites(spans, len(keys), sum(n >= 2 for n in keys.values()), sum(n >= 3 for n in keys.values()),
                    top / max(spans, 1))


@dataclass(frozen=True)
class ErrorStats:
    """A file's aggregate TOP1 errors (definitions in the module docstring); shares are fractions in [0, 1]."""

    lists: int
    top1_right: float
    cer: float
    truth_chars: float
    one_span: float  # of the lists with a wrong TOP1
    span_share: dict[str, float]  # by class: share of spans
    char_share: dict[str, float]  # by class: share of error characters
    rewrites: Rewrites  # the whole file
    rewrites_at_real: Rewrites | None  # the first REAL_LISTS lists, when the file has that many
    keys: Counter[tuple[str, str]] = field(repr=False, compare=False)
    keys_at_real: Counter[tuple[str, str]] = field(repr=False, compare=False)


def error_stats(pairs: Sequence[tuple[str, str]]) -> ErrorStats:
    """Measure (TOP1, truth) pairs; both are reduced to their Han characters first."""
    pairs = [(han_chars(top1), han_chars(truth)) for top1, truth in pairs]
    if not pairs:
        raise ValueError("error_stats needs at least one list")
    edits = truth_chars = right = wrong = single = 0
    by_span: Counter[str] = Counter()
    by_char: Counter[str] = Counter()
    keys: Counter[tuple[str, str]] = Counter()
    keys_at_real: Counter[tuple[str, str]] = Counter()
    for k, (top1, truth) in enumerate(pairs):
        edits += Levenshtein.distance(top1, truth)
        truth_chars += len(truth)
        if top1 == truth:
            right += 1
            continue
        spans = span_keys(top1, truth)
        wrong += 1
        single += len(spans) == 1
        for key in spans:
            cls = classify_span(*key)
            by_span[cls] += 1
            by_char[cls] += max(map(len, key))
            keys[key] += 1
            if k < REAL_LISTS:
                keys_at_real[key] += 1
    n_spans, n_chars = max(sum(by_span.values()), 1), max(sum(by_char.values()), 1)
    return ErrorStats(
        lists=len(pairs), top1_right=right / len(pairs), cer=edits / max(truth_chars, 1),
        truth_chars=truth_chars / len(pairs), one_span=single / max(wrong, 1),
        span_share={c: by_span[c] / n_spans for c in SPAN_CLASSES},
        char_share={c: by_char[c] / n_chars for c in SPAN_CLASSES},
        rewrites=rewrites(keys), rewrites_at_real=rewrites(keys_at_real) if len(pairs) >= REAL_LISTS else None,
        keys=keys, keys_at_real=keys_at_real)


@dataclass(frozen=True)
class Against:
    """How many of another file's spans this file has already seen."""

    spans: int  # the other file's spans
    seen: float  # share of them whose key this file holds
    seen_twice: float  # ... at least twice
    seen_at_real: float | None  # the other's first REAL_HELD_OUT lists against this file's first REAL_LISTS
    seen_twice_at_real: float | None


def _seen(keys: Counter[tuple[str, str]], other: Iterable[tuple[str, str]]) -> tuple[int, float, float]:
    other = list(other)
    n = max(len(other), 1)
    return len(other), sum(keys[k] >= 1 for k in other) / n, sum(keys[k] >= 2 for k in other) / n


def against(stats: ErrorStats, other_pairs: Sequence[tuple[str, str]]) -> Against:
    """Measure the share of `other_pairs`' spans whose rewrite `stats`' file already holds."""
    other = [[key for key in span_keys(han_chars(t), han_chars(g))] for t, g in other_pairs]
    spans, seen, twice = _seen(stats.keys, (k for keys in other for k in keys))
    if stats.rewrites_at_real is None or len(other) < REAL_HELD_OUT:
        return Against(spans, seen, twice, None, None)
    _, seen_r, twice_r = _seen(stats.keys_at_real, (k for keys in other[:REAL_HELD_OUT] for k in keys))
    return Against(spans, seen, twice, seen_r, twice_r)


# ---------------------------------------------------------------------------------------------------------------
# The real competition data's figures (2,562 labelled lists; seen-in-train: 1,000 other lists against them)


@dataclass(frozen=True)
class RealFigures:
    """The real data's aggregate TOP1 errors, in `error_stats`' definitions; None where not known."""

    top1_right: float = 0.506
    cer: float = 0.102
    truth_chars: float = 11.0
    one_span: float = 0.69
    span_share: dict[str, float] = field(default_factory=lambda: {
        "filler": 0.06, "variant": 0.02, "homophone": 0.32, "near": 0.06, "other": 0.39,
        "added": 0.06, "dropped": 0.04, "other_length": 0.06})
    # by error characters; added, dropped and other length only together (the rest of 100 %)
    char_share: dict[str, float] = field(default_factory=lambda: {
        "filler": 0.04, "variant": 0.01, "homophone": 0.27, "near": 0.06, "other": 0.40})
    char_share_length_changes: float = 0.22
    distinct: int = 1416  # in REAL_LISTS lists
    twice: int = 167
    thrice: int = 75
    top_share: float = 0.13
    seen: float = 0.335  # spans of REAL_HELD_OUT other lists seen in the REAL_LISTS
    seen_twice: float = 0.24


REAL = RealFigures()
LENGTH_CHANGES = ("added", "dropped", "other_length")
# How close a calibrated stand-in must come to REAL (tests/learn/data/test_standin.py reads these):
TOLERANCE_SHARE = 0.03  # absolute, on every share (TOP1 right, one span, span and character shares, top 30)
TOLERANCE_CER = 0.01  # absolute
TOLERANCE_LENGTH = 1.0  # characters, on the mean truth length
TOLERANCE_DISTINCT = 0.20  # relative, on the distinct rewrites (and those seen twice) in REAL_LISTS lists
TOLERANCE_SEEN = 0.06  # absolute, on the seen-in-train shares
