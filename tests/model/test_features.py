import numpy as np
import pytest

from model.features import MAX_CANDIDATES, Featurizer, Vocab, collate
from preprocess.text import NBest

COUNTS = {c: 10 for c in "我發現新元原噢於與許多天使時投資機構不同的地方央行進場買回調掉接結皆街你好密碼要進去"}


@pytest.fixture(scope="module")
def featurizer() -> Featurizer:
    return Featurizer(Vocab.from_counts(COUNTS))


def test_featurize_puts_keep_first_and_nbest_alternatives_next(featurizer):
    nb = NBest(("我 發現 新 元 噢", "我 發現 新原 噢", "我 發現 新 元 於"))
    ex = featurizer.featurize(nb)
    assert [c[0] for c in ex.candidates] == list("我發現新元噢")
    assert ex.candidates[4][1] == "原"
    assert ex.candidates[5][1] == "於"


def test_featurize_adds_same_syllable_characters(featurizer):
    ex = featurizer.featurize(NBest(("央行 進場 買 回調 接",)))
    assert "結" in ex.candidates[-1] and "街" in ex.candidates[-1]
    assert all(len(c) <= MAX_CANDIDATES for c in ex.candidates)


def test_featurize_offers_deletion_and_insertion_only_where_the_nbest_does(featurizer):
    ex = featurizer.featurize(NBest(("你好 的 密碼", "你好 密碼", "你好的 密碼")))
    assert "" in ex.candidates[2]
    assert all("" not in c for i, c in enumerate(ex.candidates) if i != 2)
    ex = featurizer.featurize(NBest(("你好 密碼", "你好 的 密碼")))
    assert "好的" in ex.candidates[1]
    assert all(len(s) == 1 for i, c in enumerate(ex.candidates) if i != 1 for s in c)


def test_featurize_labels_the_truth_candidate_or_ignores_it(featurizer):
    ex = featurizer.featurize(NBest(("央行 進場 買 回調 接", "央行 進場 買回 掉 接")), truth="央行進場買回掉結")
    assert ex.labels[0] == 0
    assert ex.candidates[6][ex.labels[6]] == "掉"
    assert ex.candidates[7][ex.labels[7]] == "結"
    ex = featurizer.featurize(NBest(("央行",)), truth="甲乙")
    assert (ex.labels == -100).all()


def test_featurize_returns_none_when_top1_has_no_chinese(featurizer):
    assert featurizer.featurize(NBest(("while e-mail", "你好"))) is None


def test_featurize_uses_chinese_characters_only(featurizer):
    ex = featurizer.featurize(NBest(("喂 你好 waa <htr> 進去 5g", "喂 您好 密碼")))
    assert ex.top1 == "喂你好進去"


def test_collate_pads_to_the_longest_input_of_the_batch(featurizer):
    exs = [featurizer.featurize(NBest(("你好",))), featurizer.featurize(NBest(("我 要 進去 了",)))]
    batch = collate(exs)
    assert batch["chars"].shape == (2, 5)
    assert batch["attn_mask"].sum(1).tolist() == [2, 5]
    assert batch["cand_mask"][:, :, 0].all()
    assert np.isfinite(batch["cand_feats"]).all()


def test_length_groups_keep_short_inputs_apart_from_long_ones():
    from model.corrector import length_groups

    lengths = [(i, 5) for i in range(20)] + [(20 + i, 40) for i in range(10)]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(30))
    assert all(max(dict(lengths)[i] for i in g) / min(dict(lengths)[i] for i in g) < 8 for g in groups)
    assert length_groups([(0, 3)]) == [[0]]
    assert length_groups([]) == []


def test_featurize_never_offers_an_orthographic_variant_of_top1():
    """Regression: the shipped model turned 台灣 into 臺灣 (OpenCC's standard form), which the judge counts wrong."""
    feat = Featurizer(Vocab.from_counts({**COUNTS, "台": 3, "臺": 50, "灣": 9, "抬": 4}))
    ex = feat.featurize(NBest(("台灣", "臺灣", "抬灣")))
    assert "臺" not in ex.candidates[0]
    assert "抬" in ex.candidates[0]


def test_featurize_writes_the_positions_every_hypothesis_agrees_on_as_the_general_path_does_to_the_bit():
    """Guards the batched rows of unanimous positions (`_fill_unanimous`): the same arrays as `_candidate_rows`."""
    sentences = ["我發現新元", "投資機構不同的地方", "央行進場買回調", "你好密碼要進去"]
    bigrams = {s[i:i + 2]: 3 for s in sentences for i in range(len(s) - 1)}
    fast = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    general = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    general._unanimous_block = lambda char: None  # every position through _candidate_rows
    for top1 in sentences:
        nbest = NBest((top1, top1, top1[:2] + "噢" + top1[3:]))  # unanimous positions beside one that is not
        a, b = fast.featurize(nbest), general.featurize(nbest)
        assert a.candidates == b.candidates
        for key in ("pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key  # float32, as the network sees them
            assert getattr(a, key).dtype == getattr(b, key).dtype


def test_featurize_batch_gives_each_list_the_arrays_it_gets_alone():
    """Guards the batch-wide fill of unanimous rows (`_fill_unanimous`): no list's rows land in another's."""
    sentences = ["我發現新元", "投資機構不同的地方", "央行進場買回調", "你好密碼要進去"]
    bigrams = {s[i:i + 2]: 3 for s in sentences for i in range(len(s) - 1)}
    feat = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    nbests = [NBest((s, s, s[:2] + "噢" + s[3:])) for s in sentences] + [NBest(("abc", "abd"))]
    batch = feat.featurize_batch(nbests)
    assert batch[-1] is None
    for nbest, together in zip(nbests[:-1], batch, strict=False):
        alone = feat.featurize(nbest)
        assert together.candidates == alone.candidates
        for key in ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            assert np.array_equal(getattr(together, key), getattr(alone, key)), key


def test_featurize_batch_keeps_its_rows_when_it_fills_the_bounded_memos(monkeypatch):
    """Guards the memo tables (`_MemoTable`): a batch that brings more new pairs than the bound is written from the rows
    it collected, and the memos are emptied before the next batch, not in the middle of one."""
    sentences = ["我發現新元", "投資機構不同的地方", "央行進場買回調", "你好密碼要進去"]
    bigrams = {s[i:i + 2]: 3 for s in sentences for i in range(len(s) - 1)}
    unbounded = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    nbests = [NBest((s, s, s)) for s in sentences]
    expected = [unbounded.featurize(nbest) for nbest in nbests]
    monkeypatch.setattr("model.features.MAX_MEMO_PAIRS", 3)
    monkeypatch.setattr("model.features.MAX_MEMO_SEGMENTS", 3)
    bounded = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    for _ in range(2):  # the second batch finds every memo over its bound
        for want, got in zip(expected, bounded.featurize_batch(nbests), strict=True):
            for key in ("cand_ids", "cand_feats", "cand_mask"):
                assert np.array_equal(getattr(want, key), getattr(got, key)), key
        assert len(bounded._left_memo.rows) > 3  # filled past the bound within the batch
    bounded.featurize_batch(nbests[:1])
    assert len(bounded._left_memo.rows) <= len(sentences[0]) + 1  # emptied before this batch, then refilled


def test_one_character_candidates_get_the_lm_columns_of_the_general_bigram_score_to_the_bit():
    """Guards `_candidate_rows`' inlined neighbour terms: the columns `_lm` (Vocab.bigram_logp summed) gives."""
    from model.contract import CANDIDATE_FEATURES, EDGE_COUNT_SCALE, LM_DELTA_SCALE
    from model.features import BOS, EOS

    bigrams = {s[i:i + 2]: 3 for s in ("我發現新元", "發線", "^我", "元$", "法現") for i in range(len(s) - 1)}
    featurizer = Featurizer(Vocab.from_counts(COUNTS, bigrams))
    featurizer._unanimous_block = lambda char: None  # every position through _candidate_rows
    example = featurizer.featurize(NBest(("我發現新元", "我發線新元", "我法現新元", "我發現新原")))
    lm_delta, left_edge, right_edge = (CANDIDATE_FEATURES.index(c) for c in
                                       ("lm_delta", "left_edge_count", "right_edge_count"))
    padded = BOS + example.top1 + EOS
    for i, cands in enumerate(example.candidates):
        keep = featurizer._lm(padded[i], cands[0], padded[i + 2])[0]
        for k, seg in enumerate(cands):
            score, edge_l, edge_r = featurizer._lm(padded[i], seg, padded[i + 2])
            row = example.cand_feats[i, k]
            assert row[lm_delta] == np.float32(max(-3.0, min(3.0, (score - keep) / LM_DELTA_SCALE))), (i, seg)
            assert (row[left_edge], row[right_edge]) == (np.float32(edge_l / EDGE_COUNT_SCALE),
                                                         np.float32(edge_r / EDGE_COUNT_SCALE)), (i, seg)
    assert sum(len(c) for c in example.candidates) > len(example.candidates)  # alternatives were scored
