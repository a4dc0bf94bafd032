"""Fixtures the model's tests share: the shipped vocabulary's featurizer and the shipped trigram (loaded once per
module that asks; a module may define its own under the same name)."""

import pytest

from config import DEFAULT_WEIGHTS_DIR
from model.features import Featurizer, Vocab
from model.lm import LanguageModel


@pytest.fixture(scope="module")
def featurizer() -> Featurizer:
    return Featurizer(Vocab.load(DEFAULT_WEIGHTS_DIR / "vocab.json"))


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel()
