"""The decoding simulator on a tiny in-memory recogniser (no corpus on disk)."""

import random
from collections import Counter
from dataclasses import replace

from preprocess.confusion import near_toneless
from learn.data.decode_sim import DEFAULT, EOS, CharBigram, DecodeConfig, DecodingSimulator
from preprocess.phones import char_syllable, text_phones
from preprocess.text import SPOKEN_FILLERS

LM_TEXT = [
    "他 在 家 裡 看 書", "我 在 家 裡 睡覺", "你 在 家 嗎", "再見", "再 說 一 次",
    "市 政府 是 我們 的", "時間 是 十 點", "事情 是 這樣", "四 個 人", "老師 說 了",
    "資料 在 這裡", "自己 做", "知道 了", "機場 很 遠", "今天 天氣 很 好", "經濟 成長",
] * 3  # fmt: skip
LEXICON = Counter(w for s in LM_TEXT for w in s.split() if len(w) > 1) + Counter(["事實", "時事", "四十"])
QUIET = DecodeConfig(noise=0.0, p_unclear=0.0, p_drop=0.0, p_insert=0.0)  # the acoustics never err


def make_simulator(config: DecodeConfig = DEFAULT) -> DecodingSimulator:
    return DecodingSimulator.from_sentences(LM_TEXT, LEXICON, config)


def test_decoding_simulator_returns_at_most_n_best_distinct_hypotheses_with_phones():
    sim = make_simulator()
    for seed in range(20):
        nb = sim.simulate("老師 說 市 政府 在 這裡", random.Random(seed))
        assert 1 <= len(nb.sentences) <= 10
        assert len({s.replace(" ", "") for s in nb.sentences}) == len(nb.sentences)
        assert all(s == " ".join(s.split()) for s in nb.sentences)  # words separated by single spaces
        assert nb.phonemes == tuple(text_phones(s) for s in nb.sentences)


def test_decoding_simulator_lists_top1_first_by_cost():
    sim = make_simulator()
    scored = sim.scored("時間 是 四 點", random.Random(4))
    assert [c for c, _ in scored] == sorted(c for c, _ in scored)
    assert sim.simulate("時間 是 四 點", random.Random(4)).sentences == tuple(t for _, t in scored)


def test_decoding_simulator_is_reproducible_with_a_seed():
    sim = make_simulator()
    assert sim.simulate("他 在 家 裡 看 書", random.Random(9)) == sim.simulate("他 在 家 裡 看 書", random.Random(9))
    assert sim.scored("他 在 家 裡 看 書", random.Random(9)) == sim.scored("他 在 家 裡 看 書", random.Random(9))
    assert sim.scored("他 在 家 裡 看 書", random.Random(9)) != sim.scored("他 在 家 裡 看 書", random.Random(10))


def test_decoding_simulator_substitutes_only_sound_alike_characters():
    sim = make_simulator(replace(QUIET, noise=3.0, p_unclear=0.5))
    truth = "事情 是 這樣 四 個 人 知道 了"
    chars = truth.replace(" ", "")
    changed = 0
    for seed in range(30):
        for hyp in sim.simulate(truth, random.Random(seed), phones=False).sentences:
            hyp = hyp.replace(" ", "")
            assert len(hyp) == len(chars)  # no insertion or deletion was offered
            for said, heard in zip(chars, hyp, strict=True):
                a, b = char_syllable(said), char_syllable(heard)
                changed += said != heard
                assert said == heard or a.toneless == b.toneless or b.toneless in near_toneless(a)
    assert changed > 0


def test_decoding_simulator_prefers_the_fluent_homophone():
    sim = make_simulator(QUIET)
    nb = sim.simulate("他 再 家 裡", random.Random(0), phones=False)  # 再 and 在 both sound zai4
    assert nb.top1.replace(" ", "") == "他在家裡"
    assert "他再家裡" in [s.replace(" ", "") for s in nb.sentences]
    assert sim.simulate("他 在 家 裡", random.Random(0)).top1.replace(" ", "") == "他在家裡"


def test_decoding_simulator_drops_and_inserts_only_when_offered():
    sim = make_simulator(replace(QUIET, p_drop=1.0, drop_cost=-20.0))
    assert sim.simulate("你 在 家 嗎", random.Random(1), phones=False).top1.replace(" ", "") == "你家嗎"
    sim = make_simulator(replace(QUIET, p_insert=1.0, insert_cost=-20.0))
    assert len(sim.simulate("你 在 家 嗎", random.Random(1), phones=False).top1.split()) > 4


def test_decoding_simulator_keeps_a_spoken_filler_unless_dropping_is_offered():
    sim = make_simulator(replace(QUIET, p_spoken_filler=1.0))
    nb, truth = sim.sample("他 在 家 裡", random.Random(2))
    assert SPOKEN_FILLERS & set(truth)
    assert nb.top1.replace(" ", "") == truth


def test_char_bigram_probabilities_sum_to_one_with_the_unseen_slot():
    lm = CharBigram(["他 在 家", "在 家 裡"])
    for prev in ("在", "<", "龍"):  # a seen context, the sentence start, an unseen context
        assert abs(sum(lm.prob(prev, c) for c in lm.unigrams) + lm.prob(prev, "龍") - 1.0) < 1e-9
    assert lm.prob("在", "家") > lm.prob("在", "裡") > lm.prob("在", "龍")
    assert lm.cost("家", EOS) < lm.cost("他", EOS)
