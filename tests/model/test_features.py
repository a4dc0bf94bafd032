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


def test_one_character_candidates_get_the_lm_columns_of_the_general_bigram_score_to_the_bit():
    """Guards `_candidate_rows`' neighbour terms of a whole position at once (`BigramLM.follow`, `.precede`): the
    columns `BigramLM.score` gives each candidate alone."""
    from model.contract import CANDIDATE_FEATURES, EDGE_COUNT_SCALE, LM_DELTA_CLIP, LM_DELTA_SCALE
    from model.features import BOS, EOS

    bigrams = {s[i:i + 2]: 3 for s in ("我發現新元", "發線", "^我", "元$", "法現") for i in range(len(s) - 1)}
    featurizer = Featurizer(Vocab.from_counts(COUNTS, bigrams), fast=False)  # every position through _candidate_rows
    example = featurizer.featurize(NBest(("我發現新元", "我發線新元", "我法現新元", "我發現新原")))
    lm_delta, left_edge, right_edge = (CANDIDATE_FEATURES.index(c) for c in
                                       ("lm_delta", "left_edge_count", "right_edge_count"))
    padded = BOS + example.top1 + EOS
    for i, cands in enumerate(example.candidates):
        keep = featurizer.lm.score(padded[i] + cands[0] + padded[i + 2])[0]
        for k, seg in enumerate(cands):
            score, edge_l, edge_r = featurizer.lm.score(padded[i] + seg + padded[i + 2])
            row = example.cand_feats[i, k]
            delta = max(-LM_DELTA_CLIP, min(LM_DELTA_CLIP, (score - keep) / LM_DELTA_SCALE))
            assert row[lm_delta] == np.float32(delta), (i, seg)
            assert (row[left_edge], row[right_edge]) == (np.float32(edge_l / EDGE_COUNT_SCALE),
                                                         np.float32(edge_r / EDGE_COUNT_SCALE)), (i, seg)
    assert sum(len(c) for c in example.candidates) > len(example.candidates)  # alternatives were scored


def test_featurizers_of_one_vocabulary_share_its_bigram_model():
    vocab = Vocab.from_counts(COUNTS, {"我發": 3})
    assert Featurizer(vocab).lm is Featurizer(vocab).lm is vocab.bigram_lm()
