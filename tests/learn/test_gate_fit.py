"""learn.gate_fit: the gate learns which of the stage's changes its list backs, within the bounds on each group."""

import math

import numpy as np

from learn.dev_list import DevList
from learn.gate_fit import fit_focus, fit_gate, gate_inputs, logistic
from model.gate import CONTEXT_FEATURES, GATE_FEATURES, Gate
from model.rerank import Features

W = np.array([1.0 if n == "lm" else 0.0 for n in Features.names()])  # the stage: the trigram's lead alone


def _list(lead: float, support: float, top1_errors: int, chosen_errors: int) -> DevList:
    """TOP1 and one candidate leading it by `lead`, whose change `support` of the other hypotheses hold."""
    feats = np.zeros((2, len(Features.names())))
    feats[1, Features.names().index("lm")] = lead
    ctx = np.zeros((2, len(CONTEXT_FEATURES)))
    ctx[1, CONTEXT_FEATURES.index("support_mean")] = support
    return DevList(feats, np.array([top1_errors, chosen_errors]), 10, ctx)


def _lists(rng: np.random.Generator, n: int, harm: float) -> list[DevList]:
    """Backed changes fix their list; unbacked ones (support < 0.3) break it `harm` of the time."""
    out = []
    for _ in range(n):
        support = float(rng.uniform())
        harmful = support < 0.3 and rng.uniform() < harm
        out.append(_list(float(rng.uniform(1, 3)), support, 0 if harmful else 1, 2 if harmful else 0))
    return out


def test_the_gate_keeps_top1_where_the_list_does_not_back_the_change():
    rng = np.random.default_rng(1)
    lists = _lists(rng, 600, harm=0.8)
    gate, figures = fit_gate(lists, W, margin=0.0, max_worse=0.01, max_right_changed=0.01)
    assert gate is not None and figures["worse"] <= 0.01
    z, _, _ = gate_inputs([_list(2.0, 0.9, 1, 0), _list(2.0, 0.05, 0, 2)], W, 0.0)
    assert gate.admits(z[0, 0], z[0, 1:]) and not gate.admits(z[1, 0], z[1, 1:])
    assert gate.weights["support_mean"] > 0


def test_the_gate_keeps_the_bounds_on_each_group_alone():
    rng = np.random.default_rng(2)
    easy, hard = _lists(rng, 900, harm=0.05), _lists(rng, 300, harm=0.9)
    lists, groups = easy + hard, [0] * 900 + [1] * 300
    gate, _ = fit_gate(lists, W, 0.0, 0.01, 0.01, groups)
    assert gate is not None
    z, chosen, seen = gate_inputs(hard, W, 0.0)
    admitted = np.array([gate.admits(row[0], row[1:]) for row in z]) & seen
    top1 = np.array([d.errors[0] for d in hard])
    assert ((chosen > top1) & admitted).sum() <= 0.01 * len(hard)


def test_the_gate_sees_only_lists_whose_change_reaches_the_stage_margin():
    z, chosen, seen = gate_inputs([_list(0.5, 1.0, 1, 0), _list(2.0, 1.0, 1, 0), DevList(np.zeros((1, 9)),
                                                                                       np.array([3]), 10)], W, 1.0)
    assert seen.tolist() == [False, True, False]
    assert z[2, 0] == -math.inf and chosen.tolist() == [0, 0, 3]
    assert z.shape[1] == len(GATE_FEATURES)


def test_no_gate_from_too_few_lists():
    gate, figures = fit_gate([_list(2.0, 0.5, 1, 0)] * 5, W, 0.0, 0.01, 0.01)
    assert gate is None and "too few" in figures["gate"]


def test_logistic_weights_are_in_the_features_own_units():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4000, 2)) * [1.0, 10.0] + [0.0, 5.0]
    p = 1 / (1 + np.exp(-(2.0 * x[:, 0] - 0.3 * x[:, 1] + 1.0)))
    w, b = logistic(x, (rng.uniform(size=4000) < p).astype(float), l2=0.0)
    assert np.allclose(w, [2.0, -0.3], atol=0.2) and abs(b - 1.0) < 0.3


def _shaped(rng: np.random.Generator, n: int, scatter: float, harm: float) -> list[DevList]:
    """Lists of one scatter whose best change leads TOP1 by 0.5 to 3 and, where under 2.5, breaks the list `harm` of
    the time."""
    out = []
    for _ in range(n):
        lead = float(rng.uniform(0.5, 3.0))
        harmful = lead < 2.5 and rng.uniform() < harm
        d = _list(lead, 0.5, 0 if harmful else 1, 2 if harmful else 0)
        d.scatter = scatter
        out.append(d)
    return out


def test_a_focused_regime_answers_the_lists_whose_hypotheses_vary_one_stretch_below_the_stage_margin():
    rng = np.random.default_rng(4)
    focused, scattered = _shaped(rng, 600, 1.2, harm=0.0), _shaped(rng, 600, 4.0, harm=0.5)
    lists, groups = focused + scattered, [0] * 600 + [1] * 600
    gate = Gate({"lead": 1.0}, margin=-1e9)  # the stage's margin alone decides the lists it is not focused on
    fitted, figures = fit_focus(lists, W, 2.5, gate, 0.01, 0.01, groups)
    assert 1.2 < fitted.focus_scatter <= 4.0 and fitted.focus_margin < 2.5
    assert fitted.weights == gate.weights and fitted.margin == gate.margin
    assert figures["focus_scatter"] == fitted.focus_scatter and figures["worse"] <= 0.01


def test_no_focused_regime_where_it_would_break_the_bounds():
    rng = np.random.default_rng(5)
    lists = _shaped(rng, 600, 1.2, harm=0.5)  # below the stage's margin the focused lists' changes break them
    gate = Gate({"lead": 1.0}, margin=-1e9)
    fitted, figures = fit_focus(lists, W, 2.5, gate, 0.01, 0.01)
    assert fitted == gate and figures["focus_scatter"] == 0.0
