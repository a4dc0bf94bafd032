"""Stand-ins whose lower hypotheses are shaped as a real recogniser's (`learn.data.focused`, issue 60)."""

from __future__ import annotations

from pathlib import Path

import pytest

from learn.data.real_profile import PROFILES
from learn.data.standin_real import build_real
from learn.list_shape import shape


@pytest.mark.parametrize("profile", ["real-shaped", pytest.param("hard-shaped", marks=pytest.mark.real_model)])
def test_shaped_standins_vary_one_or_two_stretches_as_real_lists_do(corpus_dir: Path, profile: str):
    train, _, _, _ = build_real(corpus_dir, 400, 20, seed=7, config=PROFILES[profile])
    rows = [([h.replace(" ", "") for h in it.nbest.sentences], it.truth) for it in train]
    got = shape(profile, rows)
    # real ten-hypothesis lists: 15-18 % of positions per lower hypothesis, about one span, the public requests'
    # positions where any differs about a third; the stand-ins before issue 60: 23 % and 71-81 %
    assert 0.12 <= got.differ <= 0.24
    assert got.any_differ <= 0.45
    assert got.spans <= 1.3 and got.at_most_two_spans >= 0.95
    assert got.hypotheses >= 9.5
    assert got.truth_listed is not None and 0.65 <= got.truth_listed <= 0.85


def test_the_scattered_real_profile_is_unchanged_by_the_shaped_ones(corpus_dir: Path):
    plain, _, _, _ = build_real(corpus_dir, 200, 20, seed=7, config=PROFILES["real"])
    rows = [([h.replace(" ", "") for h in it.nbest.sentences], it.truth) for it in plain]
    assert shape("real", rows).any_differ >= 0.6  # each lower hypothesis still strays somewhere of its own
