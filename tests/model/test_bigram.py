import math

import pytest

from model.bigram import PRIOR_WEIGHT, BigramLM, lm_delta
from model.contract import LM_DELTA_CLIP, LM_DELTA_SCALE

COUNTS = {"我": 6, "們": 3, "你": 1}
BIGRAMS = {"我們": 3, "^我": 2}
TOTAL = sum(COUNTS.values())
N_TYPES = len(COUNTS) + 2


@pytest.fixture(scope="module")
def lm() -> BigramLM:
    return BigramLM(COUNTS, BIGRAMS, TOTAL, N_TYPES)


def smoothed(a: str, b: str) -> float:
    """log P(b | a) written out: the bigram's count plus the unigram prior, over a's count plus the prior's weight."""
    prior = PRIOR_WEIGHT * (COUNTS.get(b, 0) + 1) / (TOTAL + N_TYPES)
    return math.log((BIGRAMS.get(a + b, 0) + prior) / (COUNTS.get(a, 0) + PRIOR_WEIGHT))


PAIRS = [("我", "們"), ("^", "我"), ("我", "你"), ("們", "我"), ("你", "甲"), ("甲", "我")]


@pytest.mark.parametrize("a, b", PAIRS)
def test_follow_gives_the_bigram_estimate_smoothed_towards_the_unigram_one(lm, a, b):
    (term,), (edge,) = lm.follow(a, [b])
    assert term == pytest.approx(smoothed(a, b), rel=1e-12)
    assert edge == math.log1p(BIGRAMS.get(a + b, 0))


def test_precede_gives_each_bigram_what_follow_gives_it_to_the_bit(lm):
    for b in ("們", "我", "甲"):
        terms, edges = lm.precede(list("^我們你甲"), b)
        for k, a in enumerate("^我們你甲"):
            assert lm.follow(a, [b]) == ([terms[k]], [edges[k]]), (a, b)


def test_a_seen_bigram_is_likelier_than_an_unseen_one_after_the_same_character(lm):
    terms, _ = lm.follow("我", ["們", "你"])
    assert terms[0] > terms[1]


def test_score_sums_the_bigrams_left_to_right_and_keeps_the_edge_counts(lm):
    score, first, last = lm.score("^我們你")
    (t1,), (e1,) = lm.follow("^", ["我"])
    (t2,), _ = lm.follow("我", ["們"])
    (t3,), (e3,) = lm.follow("們", ["你"])
    assert score == t1 + t2 + t3
    assert (first, last) == (e1, e3)
    assert lm.score("我") == (0.0, 0.0, 0.0)

def test_lm_delta_scales_and_clips_one_float_and_an_array_alike():
    import numpy as np

    diffs = [-100.0, -LM_DELTA_CLIP * LM_DELTA_SCALE, -1.0, 0.0, 2.5, LM_DELTA_CLIP * LM_DELTA_SCALE + 1e-9, 1e9]
    expected = [-LM_DELTA_CLIP, -LM_DELTA_CLIP, -1.0 / LM_DELTA_SCALE, 0.0, 2.5 / LM_DELTA_SCALE, LM_DELTA_CLIP,
                LM_DELTA_CLIP]
    assert [lm_delta(d) for d in diffs] == expected
    assert all(type(lm_delta(d)) is float for d in diffs)  # the general path keeps Python floats
    assert lm_delta(np.array([diffs, diffs])).tolist() == [expected, expected]


def test_every_seen_bigram_of_a_full_table_is_found_and_no_unseen_one_is():
    """Thousands of pairs share the table's start slots (it is at most half full): each is found past the others."""
    import random

    rnd = random.Random(7)
    chars = [chr(0x4E00 + k) for k in range(300)]
    counts = {c: rnd.randint(1, 50) for c in chars[:250]}  # the last 50 only in pairs: seen, but no count of their own
    bigrams = {a + b: rnd.randint(1, 9) for a, b in ((rnd.choice(chars), rnd.choice(chars)) for _ in range(4000))}
    total, n_types = sum(counts.values()), len(counts) + 2
    model = BigramLM(counts, bigrams, total, n_types)
    for pair in [*bigrams, *(rnd.choice(chars) + rnd.choice(chars) for _ in range(2000))]:
        a, b = pair
        prior = PRIOR_WEIGHT * (counts.get(b, 0) + 1) / (total + n_types)
        n = bigrams.get(pair, 0)
        expected = math.log(n + prior) - math.log(counts.get(a, 0) + PRIOR_WEIGHT)
        (term,), (edge,) = model.follow(a, [b])
        assert term == pytest.approx(expected, rel=1e-12) and edge == math.log1p(n), pair
        assert model.precede([a], b) == ([term], [edge])


def test_a_segment_of_other_length_or_a_character_never_counted_reads_as_unseen(lm):
    """What the featurizer may pass: multi-character segments (their term is replaced by the caller), the empty
    segment of a deletion, characters outside the counts (any plane)."""
    unseen_after_wo = lm.follow("我", ["甲"])
    for odd in ("們你", "", "𠀀", "A"):
        assert lm.follow("我", [odd]) == unseen_after_wo
        assert lm.follow(odd, ["我"]) == lm.follow("甲", ["我"])
        assert lm.precede([odd], "我") == lm.precede(["甲"], "我")


def test_sides_writes_what_follow_and_precede_give_each_position_to_the_bit():
    """`sides`, many positions' bigrams in one call (the unanimous rows'): the floats of `follow` and `precede`, past
    each position's candidates nothing written."""
    import random

    import numpy

    rnd = random.Random(11)
    chars = [chr(0x4E00 + k) for k in range(60)] + ["^", "$", "A", "𠀀"]
    counts = {c: rnd.randint(1, 50) for c in chars[:50]}
    pairs = ((rnd.choice(chars[:55]), rnd.choice(chars[:55])) for _ in range(600))
    bigrams = {a + b: rnd.randint(1, 9) for a, b in pairs}
    model = BigramLM(counts, bigrams, sum(counts.values()), len(counts) + 2)
    lefts = [rnd.choice(chars) for _ in range(300)]
    rights = [rnd.choice(chars) for _ in range(300)]
    cands = [rnd.sample(chars, rnd.randint(1, 10)) for _ in range(300)]
    out = numpy.full((300, 4, 10), 7.0)
    model.sides(lefts, cands, rights, out)
    for n in range(300):
        k = len(cands[n])
        follow, precede = model.follow(lefts[n], cands[n]), model.precede(cands[n], rights[n])
        assert out[n, :, :k].tolist() == [*follow, *precede]
        assert (out[n, :, k:] == 7.0).all()


def test_a_model_of_anything_but_characters_and_pairs_of_them_is_refused():
    with pytest.raises(ValueError):
        BigramLM({"我們": 2}, {}, 2, 3)
    with pytest.raises(ValueError):
        BigramLM({"我": 2}, {"我們你": 1}, 2, 3)
