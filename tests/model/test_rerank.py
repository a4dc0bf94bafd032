"""model.rerank: candidate sentences, the filler and variant rules, and the margin (shipped vocab and LM)."""

import math

import numpy as np
import pytest

from model.features import MAX_FROM_NBEST
from model.rerank import FLOOR_P, Features, Reranker, RerankWeights, _log_p, candidates, protected_positions
from preprocess.text import NBest

pytestmark = pytest.mark.real_model

LM_ONLY = RerankWeights(lm=1.0, rank=-0.1, margin=0.5)


def _example(featurizer, *sentences):
    return featurizer.featurize(NBest(tuple(sentences)))


def test_candidates_start_with_top1_and_hold_each_distinct_hypothesis_with_its_rank(featurizer):
    ex = _example(featurizer, "股價 不是 上漲", "股價 不是 上漲", "股價 大幅 上漲")
    cands = candidates(ex, None)
    assert [(c.text, c.rank) for c in cands] == [("股價不是上漲", 0), ("股價大幅上漲", 2)]


def test_protected_positions_hold_a_filler_that_half_the_list_holds(featurizer):
    ex = _example(featurizer, "欸 我 想 問 一下", "我 想 問 一下", "欸 我 想 問 一下", "欸 我 想 問 一下")
    assert protected_positions(ex) == {0}
    assert all(c.text.startswith("欸") for c in candidates(ex, None))


def test_reranker_keeps_a_filler_even_when_the_lm_prefers_the_list_without_it(featurizer, lm):
    ex = _example(featurizer, "欸 我 想 問 一下", "我 想 問 一下", "欸 我 想 問 一下")
    assert Reranker(lm, RerankWeights(lm=100.0, margin=0.0)).choose(ex, None) == "欸我想問一下"


def test_reranker_never_changes_a_character_into_its_variant(featurizer, lm):
    ex = _example(featurizer, "台積電 的 股價", "臺積電 的 股價")
    assert Reranker(lm, RerankWeights(rank=10.0, margin=0.0)).choose(ex, None) == "台積電的股價"
    ex = _example(featurizer, "台積電 的 故價", "臺積電 的 股價")  # a real change next to a variant: refused
    assert Reranker(lm, RerankWeights(lm=100.0, margin=0.0)).choose(ex, None) == "台積電的故價"


def test_reranker_picks_the_sentence_a_lower_hypothesis_makes_when_the_lm_prefers_it(featurizer, lm):
    ex = _example(featurizer, "今天 故價 上漲", "今天 股價 上漲", "今天 鼓架 上漲")
    assert Reranker(lm, LM_ONLY).choose(ex, None) == "今天股價上漲"


def test_reranker_answers_top1_when_no_sentence_beats_the_margin(featurizer, lm):
    ex = _example(featurizer, "今天 故價 上漲", "今天 股價 上漲")
    assert Reranker(lm, RerankWeights(lm=1.0, margin=1e9)).choose(ex, None) == "今天故價上漲"


def test_reranker_features_are_zero_for_top1_and_read_by_name(featurizer, lm):
    ex = _example(featurizer, "今天 故價 上漲", "今天 股價 上漲")
    probs = np.full((len(ex.top1), 10), 0.1)
    cands = candidates(ex, probs)
    feats = Reranker(lm, LM_ONLY).features(ex, probs, cands)
    assert not feats[0].vector().any()
    assert feats[1].changes == 1.0 and feats[1].lm > 0 and feats[1].outside_nbest == 0.0
    assert len(Features.names()) == len(feats[1].vector())


def test_rerank_weights_refuse_an_unknown_feature():
    with pytest.raises(ValueError, match="unknown features"):
        RerankWeights.from_dict({"lm": 1.0, "acoustic": 2.0})


FILLER_SLOT = ("痾 我 要 查 帳單", "呃 我 要 查 帳單", "欸 我 要 查 帳單", "我 要 查 帳單", "嗯 我 要 查 帳單")


def test_protected_positions_hold_a_filler_slot_the_list_fills_with_other_fillers(featurizer):
    """Regression: a real list whose TOP1 begins with 痾 and whose other hypotheses begin with other fillers (one with
    none) was answered without any filler; the list agrees on the slot, not on the character."""
    ex = _example(featurizer, *FILLER_SLOT)
    assert protected_positions(ex) == {0}
    assert all(c.text.startswith("痾") for c in candidates(ex, None))


def test_reranker_keeps_top1s_filler_in_a_slot_other_hypotheses_fill_otherwise(featurizer, lm):
    ex = _example(featurizer, *FILLER_SLOT)
    assert Reranker(lm, RerankWeights(lm=1.0, margin=0.0)).choose(ex, None) == "痾我要查帳單"


def test_reranker_never_offers_the_empty_sentence_even_where_every_character_may_be_deleted(featurizer, lm):
    """A hypothesis with no Han character aligns as a deletion at every position of TOP1: the sentence that takes
    them all is empty, no answer at all, and is never a candidate, so the reranker cannot choose it."""
    ex = _example(featurizer, "的 的", "<htr>")
    assert all("" in cands for cands in ex.candidates)
    deletion_everywhere = np.array([[0.0, 1.0]] * 2)  # the network sure of the deletion at each position
    texts = [c.text for c in candidates(ex, deletion_everywhere)]
    assert texts[0] == "的的" and "的" in texts and "" not in texts
    assert Reranker(lm, LM_ONLY).choose(ex, deletion_everywhere) in texts


def test_the_network_casts_no_vote_on_a_segment_the_list_offers_past_the_candidates_it_was_shown(featurizer):
    others = "古鼓谷骨固故顧雇"  # eight hypotheses, each with its own 股 at the third position
    example = _example(featurizer, "今天 股價 上漲", *(f"今天 {c}價 上漲" for c in others))
    shown, cut = others[:MAX_FROM_NBEST], others[MAX_FROM_NBEST:]
    assert all(c in example.candidates[2] for c in shown) and not any(c in example.candidates[2] for c in cut)
    probs = np.full((len(example.top1), len(example.candidates[2])), 0.01)
    probs[:, 0] = 0.5  # keep
    assert _log_p(example, probs, 2, shown[0]) == pytest.approx(math.log(0.01))
    assert _log_p(example, probs, 2, cut[0]) == pytest.approx(math.log(0.5))  # as keep: no vote either way
    assert _log_p(example, probs, 2, "孤") == pytest.approx(math.log(FLOOR_P))  # nobody offered it
