"""The second stage: choose among whole sentences with the language model, the network and the n-best's ranks.

The network scores each TOP1 position's candidates on its own; it cannot tell which reading of the whole
list is a sentence. This stage builds a few whole sentences — TOP1, every other hypothesis (aligned to TOP1's
positions), and the best combinations of the network's per-position choices — describes each against TOP1
by named features, and answers the best one when its linear score beats TOP1's by a margin. The weights and
the margin are fitted on simulated dev lists (`python -m learn.tune`) and stored with the network's weights.

Two rules hold whatever the score says (the judge's truths are Taiwan speech):
- a filler slot is kept: where TOP1 holds a spoken filler and at least half of the hypotheses hold a filler at
  that place (whichever filler each writes: the list agrees on the slot, not on the character), TOP1's filler
  stays;
- a sentence that differs from TOP1 only by orthographic variants (台/臺, 裡/裏, 著/着, ...: equal once
  converted to simplified characters) is never chosen; nor is a variant brought in next to a real change.
Both give way to an adapted folder's conventions (`model.adaptation`): where a team's labelled file shows
clearly that its transcribers write the other variant or filler, that swap is allowed. An adapted folder also
offers its confusions' rewrites of TOP1 as candidates, and adds two features (the domain LM, the confusions'
evidence).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from operator import itemgetter

import cython
import numpy as np

from model.adaptation import Adaptation, Conventions
from model.features import Example
from model.gate import Gate, context
from model.lm import LanguageModel
from model.masked_lm import MaskedLM
from model.weights_meta import RERANK_FIELDS
from preprocess.align import align_to
from preprocess.rules import RATE_FLOOR
from preprocess.text import SPOKEN_FILLERS

FLOOR_P = 1e-4  # network probability of a segment that is not among a position's candidates, nor offered by the list
MIN_OPTION_P = 0.02  # a network choice below this is not combined into sentences
MAX_OPTIONS = 3  # per position, keep included
BEAM = 8
_SCORE = itemgetter(0)  # a beam sentence's (score, segments): its score


@dataclass(frozen=True)
class Features:
    """One candidate sentence against TOP1 (all zero for TOP1 itself); read by name, never by position."""

    lm: float  # trigram log10 probability, minus TOP1's
    taiwan: float  # Taiwan unigram log10 probability of its words, minus TOP1's
    net: float  # sum over positions of ln p(choice) - ln p(keep) under the network
    rank: float  # ln(1 + rank) of the best hypothesis equal to it; 0 outside the n-best
    outside_nbest: float  # 1 when no hypothesis equals it
    changes: float  # positions changed
    oov: float  # words the trigram lacks, minus TOP1's
    domain: float  # the adapted domain LM's log10 probability, minus TOP1's (0 without adaptation)
    confusion: float  # evidence of its edits among the recogniser's learned confusions (0 without adaptation)
    mlm: float  # a team's masked LM: ln p of its changed characters minus TOP1's (`model.masked_lm`; 0 without one)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return _FEATURE_NAMES

    def vector(self) -> np.ndarray:
        # the fields read by name once, not through dataclasses.fields() per candidate (issue 21)
        return np.array([getattr(self, n) for n in _FEATURE_NAMES], dtype=np.float64)


_FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Features))
_LM, _DOMAIN, _CONFUSION = (_FEATURE_NAMES.index(n) for n in ("lm", "domain", "confusion"))
if _FEATURE_NAMES != ("lm", "taiwan", "net", "rank", "outside_nbest", "changes", "oov", "domain", "confusion", "mlm"):
    raise RuntimeError(f"Reranker.rows writes its columns in another order than Features' {_FEATURE_NAMES}")


@dataclass(frozen=True)
class RerankWeights:
    """The linear score's weight per feature, and the margin a sentence must beat TOP1 by."""

    lm: float = 0.0
    taiwan: float = 0.0
    net: float = 0.0
    rank: float = 0.0
    outside_nbest: float = 0.0
    changes: float = 0.0
    oov: float = 0.0
    domain: float = 0.0
    confusion: float = 0.0
    mlm: float = 0.0
    margin: float = math.inf
    net_only: bool = False  # the network's own threshold decides; no sentence-level stage
    # the rule pass (an adapted folder's, fitted by learn.tune.pick_rule_pass; 0: none): where the linear score keeps
    # TOP1, a candidate whose confusion evidence reaches a rule of trust `rule_trust` and whose trigram plus
    # `rule_domain` x domain LM lead over TOP1 is at least `rule_margin` is answered (the likeliest such one)
    rule_trust: float = 0.0
    rule_domain: float = 0.0
    rule_margin: float = 0.0

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, n) for n in Features.names()], dtype=np.float64)

    def rule_pass(self, rows: np.ndarray) -> int | None:
        """The rule pass's choice among candidates described by `rows` ([K, F], row 0 TOP1), or None."""
        if self.rule_trust <= 0 or len(rows) < 2:
            return None
        evidence = math.log10(max(self.rule_trust, RATE_FLOOR) / RATE_FLOOR)
        lead = rows[1:, _LM] + self.rule_domain * rows[1:, _DOMAIN]
        lead = np.where(rows[1:, _CONFUSION] >= evidence - 1e-9, lead, -np.inf)
        best = int(np.argmax(lead))
        return 1 + best if lead[best] >= self.rule_margin else None

    def to_dict(self) -> dict:
        """The fields as config.json records them; `mlm` only where a masked LM is weighed (a stage fitted without one
        reads as it always has, and as one older code reads)."""
        out = asdict(self)
        if not self.mlm:
            del out["mlm"]
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> RerankWeights:
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"rerank weights name unknown features {sorted(unknown)}; known: {Features.names()}")
        return cls(**raw)


if tuple(f.name for f in fields(RerankWeights)) != RERANK_FIELDS:
    raise RuntimeError(f"RerankWeights' fields are not the ones model.weights_meta reads: {RERANK_FIELDS}")


@dataclass(frozen=True)
class Candidate:
    """A whole sentence the second stage may answer, as TOP1's positions rewritten."""

    text: str
    choice: tuple[str, ...]  # the segment chosen at each TOP1 position
    rank: int | None  # the best rank of a hypothesis equal to it


def _has_filler(segment: str) -> bool:
    return any(c in SPOKEN_FILLERS for c in segment)


def protected_positions(example: Example) -> frozenset[int]:
    """Positions where TOP1 holds a spoken filler and at least half of the hypotheses hold some filler."""
    n = 1 + len(example.rows)
    out = set()
    for i, char in enumerate(example.top1):
        if char in SPOKEN_FILLERS and 1 + sum(_has_filler(row[i]) for row in example.rows) >= n / 2:
            out.add(i)
    return frozenset(out)


def _keeps_slot(keep: str, seg: str, conventions: Conventions | None) -> bool:
    """Tell whether a protected filler survives: TOP1's (an insertion may follow it), or a convention's swap."""
    return seg.startswith(keep) or (conventions is not None and conventions.allows(keep, seg))


def _network_combos(example: Example, probs: np.ndarray, beam: int) -> list[tuple[str, ...]]:
    """The `beam` best sentences by the network's per-position probabilities (a beam over positions)."""
    # positions where the network offers nothing but keep (most of them) extend every sentence alike
    alternatives = (probs[:, 1:] >= MIN_OPTION_P).any(axis=1)
    hyps: list[tuple[float, list[str]]] = [(0.0, [])]
    for i, cands in enumerate(example.candidates):
        if not alternatives[i] or len(cands) == 1:
            for _, segs in hyps:
                segs.append(cands[0])
            continue
        p = probs[i, : len(cands)]
        order = [k for k in np.argsort(-p)[:MAX_OPTIONS] if k == 0 or p[k] >= MIN_OPTION_P]
        if 0 not in order:
            order.append(0)
        options = [(math.log(max(float(p[k]), FLOOR_P)), cands[k]) for k in order]
        # each extension is a new list, so the keep-only appends above never touch another sentence's; the `beam` best
        # by a stable sort, as heapq.nlargest ranks them (ties in order), without its Python-level loop (issue 61)
        hyps = [(s + lp, segs + [seg]) for s, segs in hyps for lp, seg in options]
        hyps.sort(key=_SCORE, reverse=True)
        del hyps[beam:]
    return [tuple(segs) for _, segs in hyps]


def candidates(example: Example, probs: np.ndarray | None, beam: int = BEAM,
               adaptation: Adaptation | None = None) -> list[Candidate]:
    """TOP1, the other hypotheses, the network's best combinations and the adapted confusions' rewrites of TOP1,
    distinct and within the rules."""
    top1 = example.top1
    keep = tuple(top1)
    choices: list[tuple[tuple[str, ...], int | None]] = [(keep, 0)]
    choices += [(tuple(row), rank) for rank, row in enumerate(example.rows, start=1)]
    if probs is not None:
        choices += [(segs, None) for segs in _network_combos(example, probs, beam)]
    conventions = None
    if adaptation is not None:
        conventions = adaptation.conventions
        choices += [(tuple(align_to(top1, text)), None) for text in adaptation.confusions.rewrites(top1)]
    texts = ["".join(segs) for segs, _ in choices]  # each joined once
    ranks: dict[str, int] = {}
    for text, (_, rank) in zip(texts, choices, strict=True):
        if rank is not None:
            ranks.setdefault(text, rank)
    protected = protected_positions(example)
    out: dict[str, Candidate] = {}
    for text, (segs, _) in zip(texts, choices, strict=True):
        if text and text not in out and (not protected or all(_keeps_slot(keep[i], segs[i], conventions)
                                                              for i in protected)):
            out[text] = Candidate(text, segs, ranks.get(text))
    return list(out.values())


def _log_p(example: Example, probs: np.ndarray, i: int, seg: str) -> float:
    """ln p of a segment at TOP1's position i under the network. A segment another hypothesis offers there but the
    featurizer left out of the candidates (it keeps `MAX_FROM_NBEST` of them, by best rank: real lists' deepest
    hypotheses lose theirs) gets keep's probability: the network was not asked, so it casts no vote (issue 60)."""
    cands = example.candidates[i]
    if seg in cands:
        p = float(probs[i, cands.index(seg)])
    elif any(row[i] == seg for row in example.rows):
        p = float(probs[i, 0])
    else:
        p = FLOOR_P
    return math.log(max(p, FLOOR_P))


def _memo_log_p(memo: dict[tuple[int, str], float], example: Example, probs: np.ndarray, i: int, seg: str) -> float:
    value = memo.get((i, seg))
    if value is None:
        value = memo[i, seg] = _log_p(example, probs, i, seg)
    return value


class Reranker:
    """Choose one sentence per n-best list; the language model is loaded once and shared."""

    def __init__(self, lm: LanguageModel | None, weights: RerankWeights, adaptation: Adaptation | None = None,
                 gate: Gate | None = None, masked_lm: MaskedLM | None = None) -> None:
        self.lm = lm
        self.weights = weights
        self.adaptation = adaptation
        self.gate = gate
        self.masked_lm = masked_lm  # scores the `mlm` feature when given (else it is 0)
        self._w = weights.vector()

    def candidates(self, example: Example, probs: np.ndarray | None) -> list[Candidate]:
        """The sentences this reranker chooses among for one list."""
        return candidates(example, probs, adaptation=self.adaptation)

    def mlm_gains(self, examples: list[Example], cands: list[list[Candidate]]) -> list[list[float] | None]:
        """Each list's candidates' `mlm` feature, asked of the masked LM in one go for the whole batch and only for
        lists with a candidate other than TOP1; None for a list it is not asked about (and for all without one)."""
        out: list[list[float] | None] = [None] * len(examples)
        if self.masked_lm is None:
            return out
        asked = [k for k, c in enumerate(cands) if len(c) > 1]
        got = self.masked_lm.gains([examples[k].top1 for k in asked], [[c.choice for c in cands[k]] for k in asked])
        for k, gains in zip(asked, got, strict=True):
            out[k] = gains
        return out

    def features(self, example: Example, probs: np.ndarray | None, cands: list[Candidate],
                 mlm: list[float] | None = None) -> list[Features]:
        """Describe each candidate against TOP1 (`mlm`: their masked-LM gains, from `mlm_gains`)."""
        return [Features(*row) for row in self.rows(example, probs, cands, mlm)]

    @cython.locals(n=cython.Py_ssize_t, i=cython.Py_ssize_t, k=cython.Py_ssize_t, keep=tuple, changed=list,
                   log_p=dict, out=list)
    def rows(self, example: Example, probs: np.ndarray | None, cands: list[Candidate],
             mlm: list[float] | None = None) -> list[tuple[float, ...]]:
        """Each candidate's features as a tuple in `Features.names()` order (the hot path: no object per row)."""
        lm = self.lm
        top1 = example.top1
        # the trigram's scores as LMScore's fields (`LanguageModel.fields`): no object per candidate
        base = lm.fields(top1) if lm is not None else None
        adapted = self.adaptation
        domain_base = adapted.domain_lm.score(top1) if adapted is not None else 0.0
        out = []
        keep = tuple(top1)  # TOP1's characters as segments, compared with each choice's (one a position)
        n = len(keep)
        log_p: dict[tuple[int, str], float] = {}  # a list's candidates share most changes, and TOP1's keeps all
        for k, c in enumerate(cands):
            net = 0.0
            choice = c.choice
            changed = [i for i in range(min(n, len(choice))) if choice[i] != keep[i]]
            if probs is not None:  # summed as before, from a list rather than a generator (an empty sum is 0)
                net = sum([_memo_log_p(log_p, example, probs, i, choice[i]) - _memo_log_p(log_p, example, probs, i,
                                                                                           keep[i]) for i in changed])
            s = lm.fields(c.text) if lm is not None else None
            out.append((
                s[0] - base[0] if s and base else 0.0,  # lm
                s[3] - base[3] if s and base else 0.0,  # taiwan
                net,
                math.log1p(c.rank) if c.rank is not None else 0.0,  # rank
                float(c.rank is None),  # outside_nbest
                float(len(changed)),  # changes
                float(s[2] - base[2]) if s and base else 0.0,  # oov
                adapted.domain_lm.score(c.text) - domain_base if adapted is not None else 0.0,  # domain
                adapted.confusions.evidence(top1, c.text) if adapted is not None else 0.0,  # confusion
                mlm[k] if mlm is not None else 0.0,  # mlm
            ))
        return out

    def choose(self, example: Example, probs: np.ndarray | None) -> str:
        """Return the best sentence other than TOP1 when its score beats TOP1's by the margin, else TOP1."""
        return self.choose_all([example], [probs])[0]

    def choose_all(self, examples: list[Example], probs: list[np.ndarray | None]) -> list[str]:
        """`choose` for a batch's lists, the masked LM (when there is one) asked once for all of them."""
        cands = [self.candidates(example, p) for example, p in zip(examples, probs, strict=True)]
        if self.lm is not None:  # the sentences `rows` will score, scored together (one conversion to simplified)
            self.lm.fields_many([c.text for listed in cands if len(listed) > 1 for c in listed])
        gains = self.mlm_gains(examples, cands)
        return [self._choose(*args) for args in zip(examples, probs, cands, gains, strict=True)]

    def _choose(self, example: Example, probs: np.ndarray | None, cands: list[Candidate],
                mlm: list[float] | None) -> str:
        if len(cands) == 1:
            return example.top1
        if self.lm is None and not self._w.any():
            return example.top1
        # one dot product per row, as Features.vector() @ w computes it (a matrix product may sum in another order)
        rows = np.array(self.rows(example, probs, cands, mlm), dtype=np.float64)
        scores = [float(row @ self._w) for row in rows]
        # the best sentence other than TOP1, against TOP1: a fitted margin may be negative (on TOP1-alone lists every
        # other sentence pays the same outside_nbest penalty, which the margin then takes back in part)
        best = 1 + int(np.argmax(scores[1:]))
        lead = scores[best] - scores[0]
        if self._answers(example, rows, cands, best, lead) and not self._only_variants(example.top1, cands[best]):
            return cands[best].text
        ruled = self.weights.rule_pass(rows)
        if ruled is not None and not self._only_variants(example.top1, cands[ruled]):
            return cands[ruled].text
        return example.top1

    def _answers(self, example: Example, rows: np.ndarray, cands: list[Candidate], best: int, lead: float) -> bool:
        """Whether the best candidate replaces TOP1: on a list the gate finds focused, where its lead reaches the
        gate's focus margin (`model.gate`); on any other, where its lead reaches the margin and the gate admits it."""
        gate = self.gate
        if gate is not None and lead >= min(gate.focus_margin, self.weights.margin) and gate.focused(example):
            return lead >= gate.focus_margin
        return lead >= self.weights.margin and self._gate_admits(example, rows, cands, best, lead)

    def _gate_admits(self, example: Example, rows: np.ndarray, cands: list[Candidate], best: int, lead: float) -> bool:
        """Whether the gate (when the stage has one) lets the best candidate replace TOP1."""
        if self.gate is None:
            return True
        return self.gate.admits(lead, context(example, rows, [c.choice for c in cands], _FEATURE_NAMES, [best])[0])

    def _only_variants(self, top1: str, cand: Candidate) -> bool:
        """Tell whether the change brings in an orthographic variant (same character once simplified) that no
        adapted convention allows."""
        if self.lm is None:
            return False
        to_s = self.lm.to_simplified
        conventions = self.adaptation.conventions if self.adaptation is not None else None
        return any(seg != char and len(seg) == 1 and to_s(seg) == to_s(char)
                   and not (conventions is not None and conventions.allows(char, seg))
                   for seg, char in zip(cand.choice, top1, strict=True))
