"""model.lm: the word trigram with a Taiwan prior, on traditional text (the shipped LM file, no network)."""

import math
import random
from pathlib import Path

import pytest

from config import DEFAULT_LM_PATH
from model.lm import MAX_WORD, LanguageModel, LanguageModelError, kenlm_words, word_suffixes
from preprocess.text import han_chars

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel(DEFAULT_LM_PATH)


def test_lm_prefers_a_news_word_to_a_homophone_reading(lm):
    assert lm.score("股價上漲").logp > lm.score("故價上漲").logp
    assert lm.score("匯率下跌").logp > lm.score("會綠下跌").logp


def test_lm_segments_traditional_text_into_its_own_words(lm):
    assert lm.score("臺灣的捷運站在哪裡").words == ("臺灣", "的", "捷運站", "在", "哪裡")


def test_a_sentence_is_segmented_alike_whatever_was_segmented_before():
    # OpenCC converts 瞭 by its phrase: 瞭解 -> 了解, but 瞭 alone stays; a cache keyed by the traditional text alone
    # gave 瞭 the unigram of 了 in every sentence after the first that converted it so
    fresh, seasoned = LanguageModel(DEFAULT_LM_PATH), LanguageModel(DEFAULT_LM_PATH)
    seasoned.segment("他告訴讀者怎樣瞭解")
    assert seasoned.segment("在深入瞭接保險業") == fresh.segment("在深入瞭接保險業")


def test_lm_scores_orthographic_variants_alike(lm):
    assert lm.score("捷運站在哪裡").logp == lm.score("捷運站在哪裏").logp
    assert lm.score("台積電的股價").logp == lm.score("臺積電的股價").logp


def test_lm_gives_a_taiwan_word_it_lacks_the_taiwan_prior_not_the_unknown_penalty(lm):
    # 統一發票 (Taiwan's receipt lottery) is no word of the mainland trigram; the Taiwan lexicon knows it
    unknown = lm.model.score("<unk>", bos=False, eos=False)
    simple, trad, logp, known = lm.segment("統一發票")[0]
    assert (trad, known) == ("統一發票", False)
    assert logp > 4 * unknown  # one word at the Taiwan prior, not four characters at the unknown penalty
    assert lm.score("我要對統一發票").oov == 1
    assert lm.score("我要對統一發票").logp > lm.score("我要對統一法票").logp


def test_lm_scores_a_word_neither_source_knows_at_the_floor(lm):
    assert lm.segment("𠀋")[0][2] == lm.floor


def test_lm_missing_file_stops_with_one_clear_line(tmp_path: Path):
    with pytest.raises(LanguageModelError, match="LM_PATH must name a KenLM binary file"):
        LanguageModel(tmp_path / "missing.lm")


def test_kenlm_words_reads_the_word_list_the_shipped_lm_file_ends_with(lm):
    words = kenlm_words(DEFAULT_LM_PATH)
    assert words is not None and len(words) > 100_000
    assert {"银行", "股价", "台湾", "的"} <= set(words)
    assert all(w in lm.model for w in words[::97])


def test_kenlm_words_is_none_for_a_file_that_lists_no_words(tmp_path: Path):
    path = tmp_path / "plain.lm"
    path.write_bytes(b"\x00" * 64 + "沒有詞表".encode())
    assert kenlm_words(path) is None


def test_lm_prunes_a_new_window_to_the_same_words_as_looking_every_substring_up(python_lm, real_requests):
    """Guards issue 21's suffix pruning: a substring that ends no known word is skipped, never a word."""
    unpruned = LanguageModel(DEFAULT_LM_PATH, lexicon=python_lm.lexicon)
    unpruned._suffixes = None
    unpruned.split_words = unpruned._split
    assert python_lm._suffixes is not None
    sentences = {han_chars(s) for body in real_requests for s in body["sentence_list"]}
    sentences |= {"臺灣的捷運站在哪裡", "我要對統一發票", "今天故價上漲", "𠀋一下", "欸我想問一下信用卡帳單"}
    for sentence in sorted(sentences):
        assert python_lm.segment(sentence) == unpruned.segment(sentence)
        assert python_lm.score(sentence) == unpruned.score(sentence)


def test_word_suffixes_holds_every_ending_of_two_to_six_characters():
    expected = {"信用卡", "用卡", "華人民共和國", "人民共和國", "民共和國", "共和國", "和國"}
    assert word_suffixes(["信用卡", "中華人民共和國", "我"]) == expected


def test_sentences_converted_together_are_converted_as_each_alone(lm, real_requests):
    """`to_simplified_many` asks OpenCC once for many sentences, joined by line breaks: phrase rules (瞭解 -> 了解,
    瞭 alone kept) apply within each as alone, a sentence that holds a line break itself is converted alone."""
    sentences = [han_chars(s) for body in real_requests for s in body["sentence_list"]]
    sentences += ["他告訴讀者怎樣瞭解", "瞭", "解", "在深入瞭接保險業", "臺灣的捷運站在哪裡", "", "乾隆皇帝乾杯"]
    rng = random.Random(5)
    sentences += ["".join(rng.sample(s, len(s))) for s in sentences[:40]]  # characters next to new neighbours
    assert lm.to_simplified_many(sentences) == [lm.to_simplified(s) for s in sentences]
    assert lm.to_simplified_many(["瞭解\n瞭", "乾杯"]) == [lm.to_simplified("瞭解\n瞭"), "干杯"]
    assert lm.to_simplified_many([]) == []


def test_scores_asked_together_are_the_scores_asked_one_by_one(lm, real_requests):
    sentences = [han_chars(s) for body in real_requests for s in body["sentence_list"]]
    lm._scores.clear()
    together = lm.fields_many([*sentences, *sentences[:3]])  # repeated sentences too
    lm._scores.clear()
    assert together == [lm.fields(s) for s in [*sentences, *sentences[:3]]]


def test_lm_caches_scores_as_values_the_cyclic_gc_stops_tracking(lm):
    """A served process holds 200,000 cached scores: as LMScore objects they were most of what each full collection
    scanned; as tuples of numbers and strings the GC untracks them (hosting.loading.freeze_set_up)."""
    import gc

    sentence = "這句話只在這個測試裡打分"  # scored here first: an earlier test's score may sit in a frozen generation
    score = lm.score(sentence)
    gc.collect()
    gc.collect()  # a tuple is untracked once its items are: the words' tuple may be seen after the score's in a pass
    assert not gc.is_tracked(lm.fields(sentence))
    assert lm.score(sentence) == score


def reference_segment(lm: LanguageModel, trad: str) -> list[tuple[str, str, float, bool]]:
    """The plain split `LanguageModel.segment` speeds up (windows cached, pruned by suffixes, the character alone taken
    at once: issues 21 and 61): per character j, every word ending there from the longest, kept when strictly
    better."""
    simple = lm.to_simplified(trad)
    n = len(trad)
    best = [0.0] + [-math.inf] * n
    back: list[tuple[int, float, bool]] = [(0, 0.0, True)] * (n + 1)
    for j in range(1, n + 1):
        top, arg = -math.inf, back[j]
        for i in range(max(0, j - MAX_WORD), j):
            u, known, _ = lm._unigram(simple[i:j], trad[i:j])
            if u > -math.inf and best[i] + u > top:
                top, arg = best[i] + u, (i, u, known)
        best[j], back[j] = top, arg
    out = []
    j = n
    while j > 0:
        i, u, known = back[j]
        out.append((simple[i:j], trad[i:j], u, known))
        j = i
    return out[::-1]


def test_lm_splits_as_the_plain_loop_splits(lm, real_requests):
    """Varied sentences: the real lists' hypotheses, and edits of them (characters swapped in, dropped, doubled)."""
    base = sorted({han_chars(s) for body in real_requests for s in body["sentence_list"]} - {""})
    rng = random.Random(61)
    chars = "".join(base)
    sentences = [*base, "𠀋", "𠀋𠀋一下", "臺灣的捷運站在哪裡", "我要對統一發票", "他告訴讀者怎樣瞭解"]
    for _ in range(400):
        s = list(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(s))
            s[k] = rng.choice([rng.choice(chars), "", s[k] * 2])
        sentences.append("".join(s) or "我")
    sentences.append("".join(rng.choice(chars) for _ in range(80)))
    for sentence in sentences:
        assert lm.segment(sentence) == reference_segment(lm, sentence)
        words = reference_segment(lm, sentence)
        assert lm.score(sentence).words == tuple(w[1] for w in words)
