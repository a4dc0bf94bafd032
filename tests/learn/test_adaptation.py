"""The domain language model `learn.domain_lm` builds: it always loads, whatever IRSTLM writes for a small file."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from learn.domain_lm import _tlm, build_domain_lm, repair_arpa
from model.adaptation import DomainLM
from tests.learn.test_adapt import _rows

pytestmark = pytest.mark.real_model

ARPA_WITH_INF = """
\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-99\t<s>\t-0.3
-0.5\t下\t-0.2
-0.6\t雨\t-inf
-0.7\t</s>

\\2-grams:
-0.1\t下 雨
-0.2\t雨 </s>

\\end\\
"""


def test_repair_arpa_turns_an_inf_backoff_into_the_orders_lowest_finite_one(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA_WITH_INF, encoding="utf-8")
    with pytest.raises(OSError, match="Bad backoff -inf"):
        DomainLM(path)
    assert repair_arpa(path) == {"1-grams": 4, "2-grams": 2}
    assert "-0.6\t雨\t-0.3" in path.read_text(encoding="utf-8")
    assert DomainLM(path).score("下雨") > DomainLM(path).score("雨下")


def test_a_small_file_whose_tlm_output_kenlm_refuses_still_builds_a_domain_lm_that_loads(tmp_path):
    """30 truths of the adapt tests' file: IRSTLM writes -inf backoffs (every continuation of 下雨 seen), the
    crash `make adapt` had on ordinary 300-list files."""
    truths = random.Random(0).sample([r.truth for r in _rows(top1_alone=False)], 30)
    raw = tmp_path / "raw.arpa"
    text = tmp_path / "truths.txt"
    text.write_text("".join(f"<s> {' '.join(t)} </s>\n" for t in truths), encoding="utf-8")
    subprocess.run([_tlm(), f"-tr={text}", "-n=4", "-lm=msb", "-ps=no", f"-o={raw}"], check=True, capture_output=True)
    assert "\t-inf" in raw.read_text(encoding="utf-8")  # the file does trigger it

    counts = build_domain_lm(truths, tmp_path / "domain.arpa")
    assert counts["1-grams"] > 10
    assert "-inf" not in (tmp_path / "domain.arpa").read_text(encoding="utf-8")
    domain = DomainLM(tmp_path / "domain.arpa")
    assert domain.score(truths[0]) > domain.score(truths[0][::-1])


def test_a_text_of_three_sentences_builds_a_domain_lm(tmp_path):
    """Three sentences: too few for shift-beta's count-of-counts statistics; Witten-Bell needs none."""
    truths = ["我要辦理掛失", "請幫我轉接客服", "今天的匯率是多少"]
    counts = build_domain_lm(truths, tmp_path / "domain.arpa")
    assert counts["1-grams"] >= 15
    assert DomainLM(Path(tmp_path / "domain.arpa")).score("我要辦理掛失") > -10
