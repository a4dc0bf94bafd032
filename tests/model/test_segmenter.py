"""model/segmenter.pyx: the trigram's segmentation and scoring in C find the words and floats of their Python
reference, `LanguageModel._split` and `_score_fields` (the shipped LM file and lexicon)."""

import random

import pytest

import compiled
from preprocess.text import han_chars

pytestmark = pytest.mark.real_model


@pytest.mark.skipif(compiled.kernel("model", "segmenter") is None,
                    reason="the segmentation kernel is not built here (no C compiler): `_split` runs")
def test_the_segmentation_kernel_finds_the_words_and_floats_of_its_python_reference(lm, python_lm, real_requests):
    """model/segmenter.pyx against `LanguageModel._split`: the real lists' hypotheses, lexicon words strung together
    with characters that convert by their phrase (瞭, 著), variants, a character outside the BMP, 〇, a Latin letter,
    nothing at all, and a sentence longer than the service takes."""
    assert lm.split_words != lm._split  # the kernel runs here, and scores the sentences (`score` below) by KenLM's
    assert lm._kernel_fields is not None  # indices
    sentences = sorted({han_chars(s) for body in real_requests for s in body["sentence_list"]})
    rng = random.Random(62)
    words = sorted(lm.lexicon.logp)
    odd = ["𠀋", "〇", "瞭", "瞭解", "著", "着", "台", "臺", "裡", "a", "的"]
    for _ in range(2000):
        sentences.append("".join(rng.choice(words) if rng.random() < 0.7 else rng.choice(odd)
                                 for _ in range(rng.randint(0, 25))))
    sentences.append("".join(rng.choice(words) for _ in range(60)))
    for sentence in sentences:
        simple = lm.to_simplified(sentence)
        assert lm.split_words(sentence, simple) == python_lm._split(sentence, simple), sentence
        assert lm.score(sentence) == python_lm.score(sentence)


@pytest.mark.skipif(compiled.kernel("model", "segmenter") is None,
                    reason="the segmentation kernel is not built here (no C compiler): `_split` runs")
def test_a_segmenter_given_no_kenlm_model_segments_but_refuses_to_score(lm):
    kernel = compiled.kernel("model", "segmenter")
    segmenter = kernel.Segmenter({"天气": -3.0}, {"天氣": -3.5}, lm.floor, lm.oov_backoff, 6)
    assert segmenter.split("天氣", "天气") == [(0, 2, (-3.0, True, -3.5))]
    assert not segmenter.scores
    with pytest.raises(ValueError, match="no KenLM model"):
        segmenter.score_fields("天氣", "天气")
