"""A recogniser's confusions: rewrite rules with their evidence counts, as an adapted folder serves them.

Each (TOP1, truth) pair is aligned by Levenshtein opcodes; adjacent edits merge into one span (`edit_spans`). A span
becomes a rule `source -> target` at two levels of context:

- **in context**: the source with one character on each side (`^` / `$` at the sentence's edges), so that an
  insertion or a deletion (a filler the recogniser dropped or added) is anchored where it happens;
- **bare**: the source alone (only for a non-empty source), so that a domain word heard as a frequent
  homophone is recognised wherever it comes.

A rule's **rate** is how often the truth rewrote its source this way among all the times the source (in its
context) appears in the training TOP1s, right or wrong; its **trust** is its rate out of fold, shrunk toward its
kind's (issue 39). How both are learned is `learn.rule_trust`'s (`learn_confusions`); this module holds what serving
needs of them: the rules, and what they offer and credit.

Only rules whose trust reaches the **trust floor** offer a rewrite or earn confusion credit; `learn.adapt` fits the
floor on the lists it fits the stage on, never fixes it (an adapted folder's `confusions.json` holds it as
`trust_floor`; one written before the name, as `gate`). Rules learned without folds (and folders written before trust)
have no trust: their rate stands in for it and the old floors apply (`MIN_REWRITE_RATE`, `RATE_FLOOR`).

Pure strings: no model, no torch. `model.adaptation` saves the rules with their counts beside the weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from rapidfuzz.distance import Levenshtein

BOS, EOS = "^", "$"
MAX_SPAN = 4  # characters on either side of a rule; longer edits are whole-sentence differences, not confusions
RATE_FLOOR = 0.01  # a rule rarer than this among its source's occurrences carries no evidence
MIN_REWRITE_RATE = 0.05  # a rule offers its rewrite as a candidate sentence only at this rate or more
MAX_REWRITES = 8  # candidate sentences offered per list from single rules
COMBINED_RATE = 0.3  # rules at this rate or more are also applied together, in one candidate


@dataclass(frozen=True)
class Span:
    """One merged edit: top1[i1:i2] became truth[j1:j2]."""

    i1: int
    i2: int
    source: str
    target: str


def edit_spans(top1: str, truth: str) -> list[Span]:
    """Return the merged non-equal opcode blocks that turn `top1` into `truth`."""
    spans: list[Span] = []
    cur: list[int] | None = None
    for tag, i1, i2, j1, j2 in Levenshtein.opcodes(top1, truth):
        if tag == "equal":
            if cur is not None:
                spans.append(Span(cur[0], cur[1], top1[cur[0] : cur[1]], truth[cur[2] : cur[3]]))
                cur = None
            continue
        if cur is None:
            cur = [i1, i2, j1, j2]
        else:
            cur[1], cur[3] = i2, j2
    if cur is not None:
        spans.append(Span(cur[0], cur[1], top1[cur[0] : cur[1]], truth[cur[2] : cur[3]]))
    return spans


def span_context(top1: str, span: Span) -> str:
    """The span's source with one character of context on each side."""
    padded = BOS + top1 + EOS
    return padded[span.i1 : span.i2 + 2]


@dataclass(frozen=True)
class Rule:
    """`source -> target`; `source` carries its context characters when `in_context`."""

    source: str
    target: str
    in_context: bool
    count: int  # times the truth rewrote the source so
    seen: int  # times the source appeared in training TOP1s
    held_count: int = 0  # out of fold: times a held-out truth rewrote the source so, the rule learned from the rest
    held_seen: int = 0  # out of fold: times the source appeared in held-out TOP1s
    trust: float | None = None  # held-out rate shrunk toward its kind's prior; None: not estimated (the rate)

    @property
    def rate(self) -> float:
        return self.count / max(self.seen, self.count, 1)

    @property
    def weight(self) -> float:
        """What the rule is believed to be right at: its trust, or its rate where none was estimated."""
        return self.rate if self.trust is None else self.trust

    @property
    def bare_target(self) -> str:
        return self.target[1:-1] if self.in_context else self.target

    def to_row(self) -> list:
        row = [self.source, self.target, int(self.in_context), self.count, self.seen]
        if self.trust is None:
            return row
        return [*row, self.held_count, self.held_seen, self.trust]

    @classmethod
    def from_row(cls, row: list) -> Rule:
        source, target, in_context, count, seen, *held = row
        rule = cls(str(source), str(target), bool(in_context), int(count), int(seen))
        if held:
            rule = replace(rule, held_count=int(held[0]), held_seen=int(held[1]), trust=float(held[2]))
        return rule


class Confusions:
    """The rules learned from one recogniser's lists, indexed by source for rewriting and scoring."""

    def __init__(self, rules: Iterable[Rule], floor: float | None = None) -> None:
        self.rules = sorted(rules, key=lambda r: (-r.count, r.source, r.target))
        # the trust floor. None: rules without trust, the old floors; a number: the least trust that lets a rule act
        self.floor = floor
        self._by_pair: dict[tuple[str, str, bool], Rule] = {(r.source, r.target, r.in_context): r for r in self.rules}
        self._by_source: dict[tuple[str, bool], list[Rule]] = {}
        for r in self.rules:
            self._by_source.setdefault((r.source, r.in_context), []).append(r)

    def __len__(self) -> int:
        return len(self.rules)

    def with_floor(self, floor: float | None) -> Confusions:
        """The same rules under another trust floor (this one unchanged)."""
        return Confusions(self.rules, floor)

    def trusted(self) -> list[Rule]:
        """The rules, most trusted first (ties: more often seen)."""
        return sorted(self.rules, key=lambda r: (-r.weight, -r.count, r.source, r.target))

    def acts(self, rule: Rule) -> bool:
        """Tell whether a rule may offer its rewrite (its weight reaches the trust floor, or the old rate floor)."""
        return rule.weight >= (MIN_REWRITE_RATE if self.floor is None else self.floor)

    def _credits(self, rule: Rule) -> bool:
        return rule.rate > RATE_FLOOR if self.floor is None else rule.weight >= self.floor

    def to_dict(self) -> dict:
        trusted = any(r.trust is not None for r in self.rules)
        columns = ["source", "target", "in_context", "count", "seen"]
        out: dict = {"columns": columns + (["held_count", "held_seen", "trust"] if trusted else []),
                     "rules": [r.to_row() for r in self.rules]}
        if self.floor is not None:
            out["trust_floor"] = self.floor
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> Confusions:
        """The confusions `to_dict` wrote: the trust floor under "trust_floor", or "gate" in a folder written before."""
        floor = raw.get("trust_floor", raw.get("gate"))
        return cls((Rule.from_row(row) for row in raw["rules"]), None if floor is None else float(floor))

    def rule_for(self, top1: str, span: Span) -> Rule | None:
        """The rule that explains one edit of a candidate against TOP1: in context if known, else bare."""
        ctx = span_context(top1, span)
        found = self._by_pair.get((ctx, ctx[0] + span.target + ctx[-1], True))
        if found is None and span.source:
            found = self._by_pair.get((span.source, span.target, False))
        return found

    def evidence(self, top1: str, text: str) -> float:
        """Sum, over the edits that turn TOP1 into `text`, of log10(rate / RATE_FLOOR) of the rule explaining each
        (0 for an edit no rule explains, or one whose rule does not reach the trust floor). A rule's weight is its trust
        where it has one, else its rate."""
        total = 0.0
        for span in edit_spans(top1, text):
            rule = self.rule_for(top1, span)
            if rule is not None and self._credits(rule):
                total += math.log10(max(rule.weight, RATE_FLOOR) / RATE_FLOOR)
        return total

    def matches(self, top1: str) -> list[tuple[int, int, str, Rule]]:
        """Every place a rule's source occurs in TOP1: (start, end, replacement, rule), in TOP1's coordinates."""
        padded = BOS + top1 + EOS
        out: list[tuple[int, int, str, Rule]] = []
        for i in range(len(padded)):
            for j in range(i + 1, min(len(padded), i + MAX_SPAN + 2) + 1):
                sub = padded[i:j]
                for in_context in (True, False):
                    for rule in self._by_source.get((sub, in_context), ()):
                        start, end = (i, j - 2) if in_context else (i - 1, j - 1)
                        if not in_context and (start < 0 or end > len(top1)):
                            continue  # a bare source never spans the edge markers
                        out.append((start, end, rule.bare_target, rule))
        return out

    def rewrites(self, top1: str) -> list[str]:
        """Sentences TOP1 becomes under its likeliest rules: each rule alone, then the likeliest together."""
        found = [m for m in self.matches(top1) if self.acts(m[3])]
        found.sort(key=lambda m: -m[3].weight)
        out: dict[str, None] = {}
        for start, end, target, _rule in found:
            text = top1[:start] + target + top1[end:]
            if text != top1 and text:
                out.setdefault(text)
            if len(out) >= MAX_REWRITES:
                break
        combined, taken = top1, []
        for start, end, target, rule in found:  # by rate; non-overlapping, applied right to left
            combinable = rule.weight >= max(COMBINED_RATE, self.floor or 0.0)
            if combinable and all(end <= s or start >= e for s, e, _ in taken):
                taken.append((start, end, target))
        for start, end, target in sorted(taken, reverse=True):
            combined = combined[:start] + target + combined[end:]
        if combined != top1 and combined:
            out.setdefault(combined)
        return list(out)
