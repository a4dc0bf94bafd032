"""The reference learner `learn.adapt` and `learn.data.standin --stats` measure against (issue 39): a **rule memo**.

It learns the recogniser's confusions from train (TOP1, truth) pairs (`learn.rule_trust.learn_confusions`, in-sample
rates), keeps the rules seen at least `MEMO_MIN_COUNT` times at a rate of at least `MEMO_MIN_RATE`, and answers,
for a new TOP1, the best of its rewrites (each rule alone, then all of them together) when the shipped word
trigram plus `CHAR_WEIGHT` times a Witten-Bell character trigram of the train truths scores it above TOP1 by at
least the margin (log10), else TOP1. No network, no fitting: what any team would try first with a labelled file,
so a learner that cannot beat it has not learned from the file.

The same two scorers give the hardness measures of a labelled file (`hardness`): how often the trigram alone, and
the trigram plus the character trigram, score the truth above a wrong TOP1 (where they do not, a rescoring stage
cannot be right).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rapidfuzz.distance import Levenshtein

from learn.rule_trust import learn_confusions
from model.lm import LanguageModel
from preprocess.rules import Confusions
from preprocess.text import han_chars

MEMO_MIN_COUNT = 2
MEMO_MIN_RATE = 0.3
CHAR_WEIGHT = 0.5
MEMO_MARGINS = (0.0, 2.0)
BOS, EOS = "\x02", "\x03"


class CharTrigram:
    """A character trigram with interpolated Witten-Bell smoothing (log10), from a handful of texts."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.counts: list[Counter[str]] = [Counter(), Counter(), Counter()]  # n-gram strings of length 1..3
        self.followers: list[Counter[str]] = [Counter(), Counter()]  # distinct continuations of a 1- or 2-context
        self.context: list[Counter[str]] = [Counter(), Counter()]  # count of a context as a prefix
        for text in texts:
            padded = BOS + BOS + text + EOS
            for i in range(2, len(padded)):
                for n in (1, 2, 3):
                    gram = padded[i - n + 1 : i + 1]
                    if self.counts[n - 1][gram] == 0 and n > 1:
                        self.followers[n - 2][gram[:-1]] += 1
                    self.counts[n - 1][gram] += 1
                    if n > 1:
                        self.context[n - 2][gram[:-1]] += 1
        self.total = sum(self.counts[0].values())
        self.vocab = len(self.counts[0]) + 1

    def prob(self, history: str, char: str) -> float:
        p = (self.counts[0][char] + 1) / (self.total + self.vocab)  # add-one unigram: every character has mass
        for n in (1, 2):
            ctx = history[-n:]
            seen = self.context[n - 1][ctx]
            if not seen:
                continue
            types = self.followers[n - 1][ctx]
            p = (self.counts[n][ctx + char] + types * p) / (seen + types)
        return p

    def score(self, text: str) -> float:
        padded = BOS + BOS + text + EOS
        return sum(math.log10(self.prob(padded[i - 2 : i], padded[i])) for i in range(2, len(padded)))


def agreement_scorer(lm: LanguageModel) -> Callable[[list[str]], Callable[[str], float]]:
    """The memo's scorer as `learn.rule_trust` asks for one: given taught truths, the shipped word trigram plus
    `CHAR_WEIGHT` times a character trigram of those truths (log10)."""

    def taught(truths: list[str]) -> Callable[[str], float]:
        chars = CharTrigram([t for t in truths if t])
        return lambda text: lm.score(text).logp + CHAR_WEIGHT * chars.score(text)

    return taught


@dataclass
class RuleMemo:
    """The reference learner: confident rules, applied where both language models prefer the rewrite."""

    confusions: Confusions
    chars: CharTrigram
    lm: LanguageModel
    margin: float = 0.0

    @classmethod
    def learn(cls, pairs: Sequence[tuple[str, str]], lm: LanguageModel, margin: float = 0.0) -> RuleMemo:
        """Learn from (TOP1, truth) pairs, Han characters only."""
        learnt = learn_confusions([p for p in pairs if p[0] and p[1]], min_count=MEMO_MIN_COUNT)
        kept = Confusions([r for r in learnt.rules if r.rate >= MEMO_MIN_RATE], floor=MEMO_MIN_RATE)
        return cls(kept, CharTrigram([t for _, t in pairs if t]), lm, margin)

    def score(self, text: str) -> float:
        return self.lm.score(text).logp + CHAR_WEIGHT * self.chars.score(text)

    def answer(self, top1: str) -> str:
        top1 = han_chars(top1)
        rewrites = self.confusions.rewrites(top1) if top1 else []
        if not rewrites:
            return top1
        best = max(rewrites, key=self.score)
        return best if self.score(best) - self.score(top1) >= self.margin else top1


@dataclass(frozen=True)
class Hardness:
    """How far a rescoring learner can go on a labelled file (measured on its held-out lists)."""

    wrong_lists: int
    lm_prefers_truth: float  # share of wrong TOP1s whose truth the word trigram scores higher
    lm_chars_prefers_truth: float  # the same with CHAR_WEIGHT x the character trigram of the train truths
    rate_quartiles: tuple[float, float, float]  # in-sample rates of the train rules seen >= 2 times
    rate_share_half: float  # share of those rules at a rate of 0.5 or more
    memo_cer_change: dict[float, float]  # margin -> (memo CER - TOP1 CER) / TOP1 CER on the held-out lists
    memo_worse: dict[float, int]  # margin -> held-out lists the memo made worse


def hardness(train: Sequence[tuple[str, str]], held: Sequence[tuple[str, str]], lm: LanguageModel) -> Hardness:
    """The hardness measures of (TOP1, truth) pairs: rules and character trigram from `train`, scored on `held`."""
    train = [(han_chars(a), han_chars(b)) for a, b in train]
    held = [(han_chars(a), han_chars(b)) for a, b in held]
    chars = CharTrigram([t for _, t in train if t])
    wrong = [(a, b) for a, b in held if a != b and b]
    lm_wins = sum(lm.score(b).logp > lm.score(a).logp for a, b in wrong)
    both_wins = sum(lm.score(b).logp + CHAR_WEIGHT * chars.score(b) > lm.score(a).logp + CHAR_WEIGHT * chars.score(a)
                    for a, b in wrong)
    rules = learn_confusions([p for p in train if p[0] and p[1]], min_count=MEMO_MIN_COUNT).rules
    rates = sorted(r.rate for r in rules)
    quartiles = tuple(statistics.quantiles(rates, n=4)) if len(rates) >= 2 else (0.0, 0.0, 0.0)
    top1_errors = sum(Levenshtein.distance(a, b) for a, b in held)
    change, worse = {}, {}
    for margin in MEMO_MARGINS:
        memo = RuleMemo.learn(train, lm, margin)
        answers = [memo.answer(a) for a, _ in held]
        errors = [Levenshtein.distance(x, b) for x, (_, b) in zip(answers, held, strict=True)]
        change[margin] = (sum(errors) - top1_errors) / max(1, top1_errors)
        worse[margin] = sum(e > Levenshtein.distance(a, b) for e, (a, b) in zip(errors, held, strict=True))
    return Hardness(len(wrong), lm_wins / max(1, len(wrong)), both_wins / max(1, len(wrong)),
                    (quartiles[0], quartiles[1], quartiles[2]),
                    sum(r >= 0.5 for r in rates) / max(1, len(rates)), change, worse)


def main(argv: list[str] | None = None) -> int:
    """`python -m learn.memo_baseline --train FILE --data FILE`: the memo learned from one labelled file, scored on
    another (TOP1 beside it), at each of MEMO_MARGINS."""
    import argparse
    from dataclasses import asdict
    from pathlib import Path

    from learn.data.labelled import read_labelled
    from learn.evaluate import cer_score, table

    ap = argparse.ArgumentParser(description="Score the rule memo reference learner on a held-out labelled file.")
    ap.add_argument("--train", type=Path, required=True, help="labelled file the memo learns from")
    ap.add_argument("--data", type=Path, required=True, help="held-out labelled file it is scored on")
    args = ap.parse_args(argv)
    lm = LanguageModel()
    pairs = [(han_chars(it.nbest.top1), han_chars(it.truth)) for it in read_labelled(args.train)]
    held = read_labelled(args.data)
    lists, truths = [it.nbest for it in held], [han_chars(it.truth) for it in held]
    figures = {}
    for margin in MEMO_MARGINS:
        memo = RuleMemo.learn(pairs, lm, margin)
        figures[f"memo (margin {margin:g})"] = asdict(cer_score(lists, truths, [memo.answer(nb.top1) for nb in lists]))
    print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
