"""A dev list as the second stage's fitting sees it (`DevList`: its candidates' features and errors), the cut on a
per-list score with the lowest CER within precision bounds (`pick_cut`: the stage's margin, the gate's margin), and how
many lists those bounds leave room for (`thin_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DevList:
    feats: np.ndarray  # [K, F], row 0 is TOP1
    errors: np.ndarray  # [K] edit distance of each candidate to the truth
    truth_len: int
    context: np.ndarray | None = None  # [K, G] the gate's features but the lead (`model.gate.context`)
    scatter: float = 0.0  # how its hypotheses scatter their changes (`model.gate.scatter`)


def pick_cut(lists: list[DevList], lead: np.ndarray, chosen_err: np.ndarray, max_worse: float,
             max_right_changed: float, groups: list[int] | None = None) -> tuple[float, dict]:
    """The cut on `lead` (one score per list: its best other candidate answered where the score reaches the cut,
    whose errors are `chosen_err`) with the lowest CER within the precision bounds, on all lists and in each group."""
    total = sum(d.truth_len for d in lists)
    top1_err = np.array([int(d.errors[0]) for d in lists])
    base = int(top1_err.sum())
    n_right = max(1, int((top1_err == 0).sum()))
    best = (float("inf"), {"cer": base / total, "top1_cer": base / total, "worse": 0.0, "right_changed": 0.0})
    # every lead is a cut to try, negative ones too (the same score as served: Reranker.choose); the lists sorted by
    # lead once, each cut's figures read from running sums (the lists a cut changes are a prefix)
    order = np.argsort(-lead, kind="stable")
    lead, chosen_err, top1_err = lead[order], chosen_err[order], top1_err[order]
    delta = np.cumsum(chosen_err - top1_err)
    worse = np.cumsum(chosen_err > top1_err) / len(lists)
    right = np.cumsum((top1_err == 0) & (chosen_err != 0)) / n_right  # a changed right TOP1 has errors
    margins = np.unique(np.round(lead[np.isfinite(lead)], 3))
    if not len(margins):
        return best
    last = np.searchsorted(-lead, -margins, side="right") - 1  # the last list each cut changes
    errs = base + delta[last]
    ok = (worse[last] <= max_worse) & (right[last] <= max_right_changed) & (errs < base)
    group_ids = np.array(groups if groups is not None else [0] * len(lists))[order]
    for g in np.unique(group_ids):
        mine = group_ids == g
        g_worse = np.cumsum(mine & (chosen_err > top1_err)) / max(1, int(mine.sum()))
        g_right = np.cumsum(mine & (top1_err == 0) & (chosen_err != 0)) / max(1, int((mine & (top1_err == 0)).sum()))
        ok &= (g_worse[last] <= max_worse) & (g_right[last] <= max_right_changed)
    if ok.any():
        k = int(np.flatnonzero(ok)[np.argmin(errs[ok])])  # the lowest cut among the best
        i = last[k]
        best = (float(margins[k]), {"cer": float(errs[k]) / total, "top1_cer": base / total,
                                    "worse": float(worse[i]), "right_changed": float(right[i])})
    return best


# The fewest lists a precision bound should leave room for on a group: with fewer, a fit meets it by chance as often as
# by its choice (a 0.5 % bound on 1,500 lists is about 4 right TOP1s changed; docs/model.md, issue 60's fifth session).
MIN_BOUND_LISTS = 10


def thin_bounds(lists: list[DevList], max_worse: float, max_right_changed: float,
                groups: list[int] | None = None) -> dict[int, str]:
    """Per group (all lists as group 0 when None) whose bounds leave room for fewer than `MIN_BOUND_LISTS` lists made
    worse or right TOP1s changed, what they leave room for, in words."""
    out = {}
    labels = groups if groups is not None else [0] * len(lists)
    for group in sorted(set(labels)):
        mine = [d for d, g in zip(lists, labels, strict=True) if g == group]
        right = sum(int(d.errors[0]) == 0 for d in mine)
        worse_room, right_room = max_worse * len(mine), max_right_changed * right
        if min(worse_room, right_room) < MIN_BOUND_LISTS:
            out[group] = (f"{max_worse:.2%} of its {len(mine)} lists is {worse_room:.1f} made worse, "
                          f"{max_right_changed:.2%} of its {right} right TOP1s is {right_room:.1f} changed")
    return out
