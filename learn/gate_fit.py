"""Fit the second stage's abstain gate (`model.gate.Gate`) on described dev lists: `python -m learn.tune --gate`.

The stage's weights and margin stay: the gate only ever keeps TOP1 where the stage would change it, so no list gets
an answer the stage alone would not give. A logistic regression learns, from the dev lists where the stage's choice
has other errors than TOP1, whether it has fewer (L2-regularised on standardised features, by Newton's method). Its
margin is the cut on its score with the lowest CER that keeps the precision bounds on all lists and on each group
(recogniser) alone, as `learn.dev_list.pick_cut` chooses the stage's margin.
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
