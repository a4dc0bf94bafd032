"""Fixtures for the text-side tests: the corpus (built once, reproducibly) and a simulator over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from learn.data.corpus import build, write
from learn.data.simulate import load_simulator

CORPUS_DIR = Path(__file__).resolve().parents[3] / "data" / "corpus"


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not (CORPUS_DIR / "lexicon.json").exists():
        write(build(progress=False), CORPUS_DIR)
    return CORPUS_DIR


@pytest.fixture(scope="session")
def simulator(corpus_dir: Path):
    return load_simulator(corpus_dir)
