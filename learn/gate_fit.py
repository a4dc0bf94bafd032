"""Fit the second stage's abstain gate (`model.gate.Gate`) on described dev lists: `python -m learn.tune --gate`.

The stage's weights and margin stay: the gate only ever keeps TOP1 where the stage would change it, so no list gets
an answer the stage alone would not give. A logistic regression learns, from the dev lists where the stage's choice
has other errors than TOP1, whether it has fewer (L2-regularised on standardised features, by Newton's method). Its
margin is the cut on its score with the lowest CER that keeps the precision bounds on all lists and on each group
(recogniser) alone, as `learn.dev_list.pick_cut` chooses the stage's margin.

Its focused regime (`fit_focus`, `python -m learn.tune --focus`) is chosen afterwards, the gate's weights and margin
kept: the lists whose other hypotheses vary TOP1 at the same few places (`model.gate.scatter` below a bound) are
answered where the stage's lead reaches a margin of their own, which may be lower than the stage's: the one place
where the gate lets through what the stage alone would not.
"""

from __future__ import annotations

import math

import numpy as np

from learn.dev_list import DevList, pick_cut
from model.gate import GATE_FEATURES, Gate

L2 = 30.0  # on standardised features; chosen by 2-fold cross-validation on the dev lists (docs/model.md)


def gate_inputs(lists: list[DevList], w: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per list: the gate's features of its best other candidate ([N, G]; lead -inf where it has none), that
    candidate's errors, and whether the gate sees it (its lead reaches the stage's margin)."""
    z = np.zeros((len(lists), len(GATE_FEATURES)))
    chosen = np.zeros(len(lists), dtype=np.int64)
    seen = np.zeros(len(lists), dtype=bool)
    for n, d in enumerate(lists):
        chosen[n] = int(d.errors[0])
        if len(d.errors) < 2 or d.context is None:
            z[n, 0] = -math.inf
            continue
        s = d.feats @ w
        b = 1 + int(np.argmax(s[1:]))
        z[n, 0], z[n, 1:] = s[b] - s[0], d.context[b]
        chosen[n] = int(d.errors[b])
        seen[n] = z[n, 0] >= margin
    return z, chosen, seen


def logistic(x: np.ndarray, y: np.ndarray, l2: float = L2, steps: int = 50) -> tuple[np.ndarray, float]:
    """Weights and intercept of an L2-regularised logistic regression of `y` (0/1) on `x`, in `x`'s own units (fitted
    on standardised columns, the intercept not penalised)."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    xs = np.c_[np.ones(len(x)), (x - mu) / sd]
    beta = np.zeros(xs.shape[1])
    penalty = l2 * np.eye(len(beta))
    penalty[0, 0] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-xs @ beta))
        hessian = xs.T @ (xs * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, xs.T @ (y - p) - penalty @ beta)
        beta += step
        if np.abs(step).max() < 1e-8:
            break
    w = beta[1:] / sd
    return w, float(beta[0] - w @ mu)


def fit_gate(lists: list[DevList], w: np.ndarray, margin: float, max_worse: float, max_right_changed: float,
             groups: list[int] | None = None) -> tuple[Gate | None, dict]:
    """Fit the gate for a stage of weights `w` and `margin`; None (and the figures without it) when no cut keeps the
    bounds."""
    z, chosen, seen = gate_inputs(lists, w, margin)
    top1 = np.array([int(d.errors[0]) for d in lists])
    learn = seen & (chosen != top1)
    if learn.sum() < 2 * len(GATE_FEATURES) or len(set((chosen < top1)[learn])) < 2:
        return None, {"gate": f"too few dev lists to learn from ({int(learn.sum())})"}
    weights, intercept = logistic(z[learn], (chosen < top1)[learn].astype(np.float64))
    score = np.where(seen, z @ weights + intercept, -math.inf)
    cut, figures = pick_cut(lists, score, chosen, max_worse, max_right_changed, groups)
    if not math.isfinite(cut):
        return None, figures
    # the intercept folded into the margin: the served score is the features' weighted sum alone
    gate = Gate(dict(zip(GATE_FEATURES, map(float, weights), strict=True)), round(cut - intercept, 6))
    return gate, figures | {"gate_lists": int(learn.sum())}


# the scatter bounds a focused regime is tried with (`model.gate.scatter`: real lists about 2, the scattered stand-ins
# 3.5 and more at their median)
FOCUS_SCATTERS = (1.5, 2.0, 2.5, 3.0)
_ANSWERED = 1e6  # the score of a list the gate answers as it is, above any lead: every cut tried keeps its answer


def fit_focus(lists: list[DevList], w: np.ndarray, margin: float, gate: Gate, max_worse: float,
              max_right_changed: float, groups: list[int] | None = None) -> tuple[Gate, dict]:
    """`gate` with the focused regime that gives the lowest CER within the precision bounds, on all lists and in each
    group: a scatter bound of `FOCUS_SCATTERS`, and the margin (`pick_cut`'s) a focused list's lead must reach (a list
    is focused where its scatter is above 0 and below the bound: `Gate.focused`), every other list answered as `gate`
    answers it. `gate` as it is where no regime does better."""
    z, chosen, seen = gate_inputs(lists, w, margin)
    lead = z[:, 0]
    admitted = seen & np.array([gate.admits(float(z[n, 0]), z[n, 1:]) if seen[n] else False
                                for n in range(len(lists))])
    scatters = np.array([d.scatter for d in lists])
    fixed = np.where(admitted, _ANSWERED, -math.inf)
    best, best_figures = gate, pick_cut(lists, fixed, chosen, max_worse, max_right_changed, groups)[1]
    for bound in FOCUS_SCATTERS:
        score = np.where((scatters > 0) & (scatters < bound) & np.isfinite(lead), lead, fixed)
        cut, figures = pick_cut(lists, score, chosen, max_worse, max_right_changed, groups)
        if math.isfinite(cut) and cut < _ANSWERED and figures["cer"] < best_figures["cer"] - 1e-12:
            best = Gate(dict(gate.weights), gate.margin, bound, cut)
            best_figures = figures
    return best, best_figures | {"focus_scatter": best.focus_scatter,
                                 "focus_margin": best.focus_margin if best.focus_scatter > 0 else None}
