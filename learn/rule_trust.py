"""Learning a recogniser's confusions from (TOP1, truth) pairs: the rules with their counts, rates and trust
(`learn_confusions`; what the rules are, and how a served folder uses them, is `preprocess.rules`'s).

Rules seen fewer than `min_count` times are not kept. The in-sample rate flatters a rule: it was kept because its
rewrite was seen, on the very lists that count it. On real lists most rules are wrong most of the time they could
fire (有 → 又 right 10 times of 252, issue 39), so a rule earns its place by its **trust** (`folds=K`):

- **out of fold**: the pairs are cut in K folds; in each, the rules the other folds saw (at least `min_count` - 1
  times: the held-out rewrite is the one missing) are counted on the held-out fold: how often its TOP1s hold the
  rule's source (`held_seen`) and how often its truths rewrote it so (`held_count`). Summed over folds, that is how
  the rule does on lists it did not come from;
- **shrunk toward its kind**: rules of one kind (the span's class, `learn.error_stats.classify_span`, in context or
  bare) share a Beta prior fitted to their held-out counts by maximum beta-binomial likelihood (empirical Bayes); a
  rule's trust is its posterior mean, (held_count + a) / (held_seen + a + b): a rule seen rarely out of fold is
  trusted as its kind is, one seen often as it did.

With a `scorer` (`learn.adapt` gives one: the shipped word trigram plus half a character trigram of the taught truths,
`learn.memo_baseline.agreement_scorer`), trust is **conditioned on the language models' agreement**: out of fold, a
place where a rule's source occurs counts as a trial only where the scorer, built from the other folds' truths, prefers
TOP1 rewritten by the rule to TOP1, and as a hit where that rewrite is closer to the truth. A rule acts in the second
stage where the language models prefer its rewrite, so that is the rate that tells whether it should: a rule wrong at
most of the places its source occurs may be right at most of those where the models prefer it.
`held_seen` and `held_count` then count those places.

`learn.adapt` fits the trust floor (the least trust that lets a rule act) among `TRUST_FLOORS` on the lists it fits
the stage on.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from rapidfuzz.distance import Levenshtein

from learn.error_stats import classify_span
from preprocess.rules import BOS, EOS, MAX_SPAN, Confusions, Rule, edit_spans, span_context

# the trust floors `learn.adapt` chooses among, on the lists it fits the stage on; FLOOR_CLOSED lets no rule act
TRUST_FLOORS = (0.05, 0.1, 0.2, 0.3, 0.5)
FLOOR_CLOSED = 1.01
# a kind with fewer rules measured out of fold takes the prior of all rules
MIN_RULES_PER_KIND = 8
PRIOR_STRENGTHS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# given the truths a fold is taught, a sentence scorer (higher: likelier); see the module's docstring
Scorer = Callable[[list[str]], Callable[[str], float]]


def learn_confusions(pairs: Iterable[tuple[str, str]], min_count: int = 2, folds: int = 0, seed: int = 0,
                     floor: float | None = None, scorer: Scorer | None = None) -> Confusions:
    """Count rules over (TOP1, truth) pairs, then how often each kept rule's source appears in the TOP1s; with
    `folds` >= 2, each rule's trust (out of fold, where `scorer` prefers its rewrite when one is given, shrunk toward
    its kind: the module's docstring); `floor` the trust floor the confusions serve."""
    pairs = list(pairs)
    counts = _rule_counts(pairs)
    kept = {k: n for k, n in counts.items() if n >= min_count}
    seen = _occurrences([top1 for top1, _ in pairs], {(src, ctx) for src, _, ctx in kept})
    rules = [Rule(src, tgt, ctx, n, seen.get((src, ctx), n)) for (src, tgt, ctx), n in kept.items()]
    if folds >= 2 and len(pairs) >= folds:
        held = _held_out(pairs, kept, min_count, folds, seed) if scorer is None else \
            _held_out_agreed(pairs, kept, min_count, folds, seed, scorer)
        rules = _trusted(rules, held)
    return Confusions(rules, floor)


def _rule_counts(pairs: list[tuple[str, str]]) -> Counter[tuple[str, str, bool]]:
    """How often each rule (in context, and bare) rewrote TOP1 into the truth over the pairs."""
    counts: Counter[tuple[str, str, bool]] = Counter()
    for top1, truth in pairs:
        for span in edit_spans(top1, truth):
            if len(span.source) > MAX_SPAN or len(span.target) > MAX_SPAN:
                continue
            ctx = span_context(top1, span)
            counts[(ctx, ctx[0] + span.target + ctx[-1], True)] += 1
            if span.source:
                counts[(span.source, span.target, False)] += 1
    return counts


def _folds(pairs: list[tuple[str, str]], folds: int, seed: int) -> tuple[list[list[tuple[str, str]]],
                                                                       list[Counter[tuple[str, str, bool]]]]:
    """The pairs dealt into `folds` seeded folds, and each fold's rule counts."""
    rng = random.Random(seed)
    parts: list[list[tuple[str, str]]] = [[] for _ in range(folds)]
    for pair in pairs:
        parts[rng.randrange(folds)].append(pair)
    return parts, [_rule_counts(part) for part in parts]


def _held_out(pairs: list[tuple[str, str]], kept: dict[tuple[str, str, bool], int], min_count: int, folds: int,
              seed: int) -> dict[tuple[str, str, bool], tuple[int, int]]:
    """Each kept rule's (hits, trials) on held-out folds, counted only in the folds whose other folds teach it."""
    parts, part_counts = _folds(pairs, folds, seed)
    out: dict[tuple[str, str, bool], tuple[int, int]] = {}
    for k, part in enumerate(parts):
        # taught by the other folds where they saw it at least once (min_count - 1): a rule the folder serves was
        # seen min_count times, and one of them is the evidence being held out; at min_count a rule seen twice would
        # never score a held-out hit (both rewrites elsewhere), and trust would punish every rare rule alike
        taught = [key for key, n in kept.items() if n - part_counts[k][key] >= max(1, min_count - 1)]
        seen = _occurrences([top1 for top1, _ in part], {(src, ctx) for src, _, ctx in taught})
        for key in taught:
            hits = part_counts[k][key]
            trials = max(seen.get((key[0], key[2]), 0), hits)
            h, t = out.get(key, (0, 0))
            out[key] = (h + hits, t + trials)
    return out


def _held_out_agreed(pairs: list[tuple[str, str]], kept: dict[tuple[str, str, bool], int], min_count: int,
                     folds: int, seed: int, scorer: Scorer) -> dict[tuple[str, str, bool], tuple[int, int]]:
    """`_held_out`, counting a trial only where the scorer taught by the other folds prefers the rule's rewrite, and
    a hit where that rewrite is also closer to the truth."""
    parts, part_counts = _folds(pairs, folds, seed)
    out: dict[tuple[str, str, bool], tuple[int, int]] = {}
    for k, part in enumerate(parts):
        taught = Confusions([Rule(src, tgt, ctx, n, n) for (src, tgt, ctx), n in kept.items()
                             if n - part_counts[k][(src, tgt, ctx)] >= max(1, min_count - 1)])
        score = scorer([truth for j, other in enumerate(parts) if j != k for _, truth in other])
        for top1, truth in part:
            base, before = score(top1), Levenshtein.distance(top1, truth)
            for start, end, target, rule in taught.matches(top1):
                rewritten = top1[:start] + target + top1[end:]
                if not rewritten or rewritten == top1 or score(rewritten) <= base:
                    continue
                key = (rule.source, rule.target, rule.in_context)
                h, t = out.get(key, (0, 0))
                out[key] = (h + (Levenshtein.distance(rewritten, truth) < before), t + 1)
    return out


def rule_kind(rule: Rule) -> tuple[str, bool]:
    """The kind a rule's prior is shared with: its span's class, and whether it is in context."""
    source, target = (rule.source[1:-1], rule.target[1:-1]) if rule.in_context else (rule.source, rule.target)
    return classify_span(source, target), rule.in_context


def beta_prior(measured: list[tuple[int, int]]) -> tuple[float, float]:
    """The Beta(a, b) that best explains (hits, trials) pairs (beta-binomial likelihood over `PRIOR_STRENGTHS`,
    its mean the pooled rate)."""
    hits, trials = sum(h for h, _ in measured), sum(t for _, t in measured)
    mean = min(max((hits + 0.5) / (trials + 1.0), 1e-3), 1 - 1e-3)

    def log_lik(strength: float) -> float:
        a, b = mean * strength, (1 - mean) * strength
        return sum(math.lgamma(h + a) + math.lgamma(t - h + b) - math.lgamma(t + a + b)
                   - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b) for h, t in measured)

    strength = max(PRIOR_STRENGTHS, key=log_lik) if measured else PRIOR_STRENGTHS[0]
    return mean * strength, (1 - mean) * strength


def _trusted(rules: list[Rule], held: dict[tuple[str, str, bool], tuple[int, int]]) -> list[Rule]:
    """Each rule with its held-out counts and its trust: the posterior mean under its kind's Beta prior."""
    kinds = {id(r): rule_kind(r) for r in rules}
    measured: dict[tuple[str, bool] | None, list[tuple[int, int]]] = {None: []}
    for r in rules:
        h, t = held.get((r.source, r.target, r.in_context), (0, 0))
        if t:
            measured.setdefault(kinds[id(r)], []).append((h, t))
            measured[None].append((h, t))
    priors = {kind: beta_prior(m) for kind, m in measured.items() if kind is None or len(m) >= MIN_RULES_PER_KIND}
    out = []
    for r in rules:
        h, t = held.get((r.source, r.target, r.in_context), (0, 0))
        a, b = priors.get(kinds[id(r)], priors[None])
        out.append(replace(r, held_count=h, held_seen=t, trust=round((h + a) / (t + a + b), 5)))
    return out


def _occurrences(texts: list[str], sources: set[tuple[str, bool]]) -> dict[tuple[str, bool], int]:
    """Count how often each (source, in_context) appears in the texts (edges padded as in the rules)."""
    lengths = {len(src) for src, _ in sources}
    counts: Counter[tuple[str, bool]] = Counter()
    for text in texts:
        padded = BOS + text + EOS
        for n in lengths:
            for i in range(len(padded) - n + 1):
                sub = padded[i : i + n]
                if (sub, True) in sources:
                    counts[(sub, True)] += 1
                if (sub, False) in sources and BOS not in sub and EOS not in sub:
                    counts[(sub, False)] += 1
    return dict(counts)
