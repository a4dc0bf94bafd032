"""Fixtures the model's tests share: the shipped vocabulary's featurizer and the shipped trigram, with its segmentation
kernel where built and without (loaded once per module that asks; a module may define its own under the same name)."""

import pytest

import compiled
from config import DEFAULT_LM_PATH, DEFAULT_WEIGHTS_DIR
from model.features import Featurizer, Vocab
from model.lm import LanguageModel


@pytest.fixture(scope="module")
def featurizer() -> Featurizer:
    return Featurizer(Vocab.load(DEFAULT_WEIGHTS_DIR / "vocab.json"))


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel()


@pytest.fixture(scope="module")
def python_lm(lm) -> LanguageModel:
    """The language model as it runs where the segmentation kernel is not built (model/segmenter.pyx): `_split`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "kernel", lambda package, name: None)
        out = LanguageModel(DEFAULT_LM_PATH, lexicon=lm.lexicon)
    assert out.split_words == out._split
    return out
