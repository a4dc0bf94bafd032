"""The second stage's abstain gate: whether the sentence the linear score prefers is safe to answer.

The linear score (`model.rerank`) ranks a list's candidate sentences; its margin alone decides whether the best one
replaces TOP1. That is enough on recognisers like the ones the score was fitted on, whose wrong hypotheses the
trigram rarely prefers. On a recogniser whose other hypotheses hold fluent errors, the same lead often means a
change for the worse. The gate looks at the change in its list: how many of the other hypotheses hold it, how much
trigram gain each changed position brings, whether the network likes it best. A logistic score of these
(`GATE_FEATURES`, fitted by `learn.gate_fit` on dev lists of several recognisers, with a precision bound on each)
must reach the gate's margin, else TOP1 stays.

Every feature is computed from the list itself: the gate keeps no state between questions. Its logistic score does
not read how far a list's hypotheses disagree as a whole: our scattered stand-in recognisers' lower hypotheses differ
from TOP1 at 71-81 % of its positions, real lists' (the challenge's public sample requests) and our simulated ones' at
20-40 %, so a score that read it would learn our stand-ins' make, not the risk of a change.

What the gate does read of the list as a whole is its `scatter`: at how many places the other hypotheses change TOP1,
against how many each one changes. Real recognisers' lists vary the same one or two uncertain stretches (about 2; the
real-shaped stand-ins 1.8), so their best change is one of few; lists whose hypotheses each bring fluent changes of
their own elsewhere (3.5 and more) offer many independent changes, and the best lead of many is more often noise. A
list focused below the fitted `focus_scatter` (issue 60) has its best change answered where the stage's lead reaches
`focus_margin`, lower than the stage's margin, without the logistic score; other lists as before, and so is a list
whose other hypotheses change nothing (or that has none: its candidates are the network's, not the list's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.features import Example
from model.weights_meta import GATE_FEATURES

# the candidate's own features (`model.rerank.Features`) the gate reads, by name: GATE_FEATURES[1:8]
CANDIDATE_FEATURES = GATE_FEATURES[1:8]
# the columns of `context`: every gate feature but the lead, which depends on the linear weights
CONTEXT_FEATURES = GATE_FEATURES[1:]


def context(example: Example, rows: np.ndarray, choices: list[tuple[str, ...]], names: tuple[str, ...],
            which: list[int] | None = None) -> np.ndarray:
    """The gate's features but the lead, one row per candidate ([K, len(CONTEXT_FEATURES)]), or per candidate of
    `which` (the served path asks for the stage's choice alone).

    `rows` are the candidates' `Features` ([K, F], columns named by `names`, row 0 TOP1) and `choices` their
    segments at each of TOP1's positions."""
    col = {n: names.index(n) for n in CANDIDATE_FEATURES}
    top1 = example.top1
    others = example.rows
    several = float(bool(others))
    best_net = float(rows[:, col["net"]].max())
    which = list(range(len(rows))) if which is None else which
    out = np.zeros((len(which), len(CONTEXT_FEATURES)))
    for j, k in enumerate(which):
        row, choice = rows[k], choices[k]
        changed = [i for i, (seg, char) in enumerate(zip(choice, top1, strict=True)) if seg != char]
        support = [sum(r[i] == choice[i] for r in others) / len(others) for i in changed] if others else []
        out[j] = [*(row[col[name]] for name in CANDIDATE_FEATURES), several, min(support, default=0.0),
                  sum(support) / len(support) if support else 0.0, row[col["lm"]] / max(1.0, row[col["changes"]]),
                  float(row[col["net"]] >= best_net)]
    return out


def scatter(example: Example) -> float:
    """At how many of TOP1's positions any other hypothesis differs, over how many one of them differs at on average:
    about 1 where all vary the same stretch, the number of hypotheses where each changes a place of its own; 0 for a
    list whose other hypotheses all equal TOP1, or that has none."""
    top1, rows = example.top1, example.rows
    places = changed = 0
    for i, char in enumerate(top1):
        here = sum(row[i] != char for row in rows)
        places += here > 0
        changed += here
    return places * len(rows) / changed if changed else 0.0


@dataclass(frozen=True)
class Gate:
    """A fitted gate: a weight per gate feature (missing: 0) and the margin its score must reach; lists focused below
    `focus_scatter` answered at the stage's lead `focus_margin` instead (none by default)."""

    weights: dict[str, float] = field(default_factory=dict)
    margin: float = 0.0
    focus_scatter: float = 0.0
    focus_margin: float = math.inf

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(GATE_FEATURES)
        if unknown:
            raise ValueError(f"the gate names unknown features {sorted(unknown)}; known: {GATE_FEATURES}")

    def vector(self) -> np.ndarray:
        return np.array([self.weights.get(n, 0.0) for n in GATE_FEATURES], dtype=np.float64)

    def scores(self, leads: np.ndarray, contexts: np.ndarray) -> np.ndarray:
        """The gate's score of candidates with these leads and `context` rows."""
        w = self.vector()
        return leads * w[0] + contexts @ w[1:]

    def admits(self, lead: float, context_row: np.ndarray) -> bool:
        return float(self.scores(np.array([lead]), context_row[None, :])[0]) >= self.margin

    def focused(self, example: Example) -> bool:
        """Whether the list's change is answered by `focus_margin` alone: its other hypotheses change TOP1, and their
        scatter is below `focus_scatter`."""
        return self.focus_scatter > 0 and 0 < scatter(example) < self.focus_scatter

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": dict(self.weights), "margin": self.margin}
        if self.focus_scatter > 0:
            out |= {"focus_scatter": self.focus_scatter, "focus_margin": self.focus_margin}
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Gate:
        focus = {k: float(raw[k]) for k in ("focus_scatter", "focus_margin") if k in raw}
        return cls({k: float(v) for k, v in raw["weights"].items()}, float(raw["margin"]), **focus)
