import numpy as np

from model.features import Featurizer, Vocab
from preprocess.text import NBest

COUNTS = {c: 10 for c in "我發現新元原噢於與許多天使時投資機構不同的地方央行進場買回調掉接結皆街你好密碼要進去"}
SENTENCES = ["我發現新元", "投資機構不同的地方", "央行進場買回調", "你好密碼要進去"]
BIGRAMS = {s[i:i + 2]: 3 for s in SENTENCES for i in range(len(s) - 1)}


def test_featurize_writes_the_positions_every_hypothesis_agrees_on_as_the_general_path_does_to_the_bit():
    """The fast path's contract (`model.unanimous`): the same arrays as the general path (`_candidate_rows`)."""
    fast = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    general = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS), fast=False)  # every position through _candidate_rows
    for top1 in SENTENCES:
        nbest = NBest((top1, top1, top1[:2] + "噢" + top1[3:]))  # unanimous positions beside one that is not
        a, b = fast.featurize(nbest), general.featurize(nbest)
        assert a.candidates == b.candidates
        for key in ("pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key  # float32, as the network sees them
            assert getattr(a, key).dtype == getattr(b, key).dtype


def test_featurize_batch_gives_each_list_the_arrays_it_gets_alone():
    """Guards the batch-wide fill of unanimous rows (`UnanimousRows.fill`): no list's rows land in another's."""
    feat = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    nbests = [NBest((s, s, s[:2] + "噢" + s[3:])) for s in SENTENCES] + [NBest(("abc", "abd"))]
    batch = feat.featurize_batch(nbests)
    assert batch[-1] is None
    for nbest, together in zip(nbests[:-1], batch, strict=False):
        alone = feat.featurize(nbest)
        assert together.candidates == alone.candidates
        for key in ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(together, key), getattr(alone, key)), key


def test_featurize_batch_keeps_its_rows_when_it_fills_the_bounded_memos(monkeypatch):
    """Guards the memo tables (`model.memo`): a batch that brings more new characters than the bound is written from the
    rows it collected, and the memos are emptied before the next batch, not in the middle of one."""
    unbounded = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    nbests = [NBest((s, s, s)) for s in SENTENCES]
    expected = [unbounded.featurize(nbest) for nbest in nbests]
    for limit in ("model.unanimous.MAX_MEMO_BLOCKS", "model.features.MAX_MEMO_SEGMENTS",
                  "model.features.MAX_MEMO_CHARS"):
        monkeypatch.setattr(limit, 3)
    bounded = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    for _ in range(2):  # the second batch finds every memo over its bound
        for want, got in zip(expected, bounded.featurize_batch(nbests), strict=True):
            for key in ("cand_ids", "cand_feats", "cand_mask"):
                assert np.array_equal(getattr(want, key), getattr(got, key)), key
        assert len(bounded.unanimous.blocks.entries) > 3  # filled past the bound within the batch
    bounded.featurize_batch(nbests[:1])
    assert len(bounded.unanimous.blocks.entries) <= len(SENTENCES[0])  # emptied before this batch, then refilled


def test_rows_freed_by_the_bound_are_rewritten_whole_for_other_lists(monkeypatch):
    """Guards the blocks' memo table: a row is reused after the memo is emptied, and a row written for a character
    with fewer candidates than the one before it holds zeros, not the old rows, past its candidates."""
    first = [NBest((s, s, s)) for s in SENTENCES]
    second = [NBest((s[::-1], s[::-1])) for s in SENTENCES]
    expected = [Featurizer(Vocab.from_counts(COUNTS, BIGRAMS)).featurize(nbest) for nbest in second]
    monkeypatch.setattr("model.unanimous.MAX_MEMO_BLOCKS", 3)
    bounded = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    bounded.featurize_batch(first)
    for want, got in zip(expected, bounded.featurize_batch(second), strict=True):
        for key in ("cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(want, key), getattr(got, key)), key


def test_memos_filled_at_set_up_give_the_arrays_filled_on_demand():
    """`Featurizer.fill_memos` memoises every vocabulary character before any batch: the same arrays as memos filled
    as the characters come."""
    filled = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    filled.fill_memos()
    assert set(filled.unanimous.blocks.entries) == set(COUNTS)
    on_demand = Featurizer(Vocab.from_counts(COUNTS, BIGRAMS))
    for top1 in SENTENCES:
        nbest = NBest((top1, top1, top1[:2] + "噢" + top1[3:]))
        a, b = filled.featurize(nbest), on_demand.featurize(nbest)
        assert a.candidates == b.candidates
        for key in ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
