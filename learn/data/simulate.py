"""ASR n-best simulator: turn a clean, word-segmented sentence into a realistic n-best list.

The recogniser is modelled as a lattice of independent uncertain words. Most words are certain; an
uncertain word has a few competing spellings, each with a score: the true word, same-syllable or
near-syllable character substitutions, a whole-word homophone, a re-segmentation that keeps the
characters, a dropped function word, and now and then a filler inserted before it. TOP1 takes the best
spelling of every word, and the n-best list is the k best combinations by total score, so neighbouring
hypotheses differ in one or two places, as in the real lists. A few errors are "certain" (no competing
spelling offers the truth), so the truth is sometimes not in the list at all.

`python -m learn.data.simulate` prints the statistics of the default and the review configurations.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from dataclasses import dataclass
from pathlib import Path

from preprocess.confusion import ConfusionSet
from preprocess.phones import text_phones
from preprocess.text import SPOKEN_FILLERS, NBest

FILLERS = ("喂", "噢", "啊", "呃", "嗯", "的", "那")
# Fillers a speaker says, commonest first (what `Simulator.utter` puts into a truth).
SAID_FILLERS = ("欸", "呃", "喂", "嗯", "痾", "啊", "那")
DROPPABLE = frozenset("的了是在就也有和都啊")


@dataclass(frozen=True)
class SimConfig:
    """Error rates and mixes of one simulated recogniser (the defaults aim at TOP1 CER about 9 %)."""

    n_best: int = 10
    p_uncertain: float = 0.35  # a word has competing spellings
    p_top1_wrong: float = 0.40  # an uncertain word's best spelling is not the truth
    p_certain_error: float = 0.015  # a word is misrecognised with no competitor offering the truth
    # A recogniser drops spoken fillers more often than it invents them: a truth holds a said filler in
    # p_spoken_filler of sentences, TOP1 drops it with p_filler_dropped (other hypotheses mostly keep it),
    # and a filler nobody said is inserted before a word with p_filler.
    p_filler: float = 0.008
    p_spoken_filler: float = 0.08
    p_filler_dropped: float = 0.3
    alternatives: tuple[int, ...] = (1, 2, 2, 3, 3)  # number of competing spellings, drawn uniformly
    # mix of competitor kinds: same syllable, near syllable, word homophone, re-segment, drop, random char
    mix: tuple[float, ...] = (0.46, 0.18, 0.12, 0.12, 0.06, 0.06)
    score_spread: float = 1.0


DEFAULT = SimConfig()
# The second evaluation set's recogniser: other error rates and another mix (more near-syllable and
# random substitutions, more drops, more errors with no competitor offering the truth).
REVIEWS = SimConfig(
    n_best=8,
    p_uncertain=0.26,
    p_top1_wrong=0.38,
    p_certain_error=0.02,
    p_filler=0.015,
    p_spoken_filler=0.12,
    p_filler_dropped=0.4,
    alternatives=(1, 2, 2, 3, 4),
    mix=(0.34, 0.26, 0.10, 0.10, 0.10, 0.10),
    score_spread=1.4,
)


def utter(sentence: str, rng: random.Random, p_spoken_filler: float) -> str:
    """Return what the speaker said: the sentence, in p_spoken_filler of cases with a filler at its start
    (mostly) or mid-way, commoner fillers likelier."""
    words = sentence.split()
    if not words or rng.random() >= p_spoken_filler:
        return sentence
    at = 0 if rng.random() < 0.7 else rng.randrange(len(words))
    filler = rng.choices(SAID_FILLERS, [1.0 / (i + 1) for i in range(len(SAID_FILLERS))])[0]
    return " ".join(words[:at] + [filler] + words[at:])


class Simulator:
    """Make n-best lists from clean sentences with a given error configuration."""

    def __init__(self, confusion: ConfusionSet, vocab: list[str], config: SimConfig = DEFAULT) -> None:
        self.confusion = confusion
        self.vocab = vocab
        self.config = config

    def _sub_char(self, char: str, kind: int, rng: random.Random) -> str:
        if kind == 0:
            pool = self.confusion.same_syllable(char)[:12]
        elif kind == 1:
            pool = self.confusion.near_syllable(char)[:12] or self.confusion.same_syllable(char)[:12]
        else:
            pool = []
        if not pool:
            return rng.choice(self.vocab[:3000])
        # frequent characters are likelier outputs of a recogniser's language model
        weights = [1.0 / (i + 1) for i in range(len(pool))]
        return rng.choices(pool, weights)[0]

    def _corrupt(self, word: str, rng: random.Random) -> list[str] | None:
        """Return one competing spelling of a word as a list of words, or None if the kind does not apply."""
        kind = rng.choices(range(6), self.config.mix)[0]
        if kind in (0, 1, 5):
            pos = rng.randrange(len(word))
            new = self._sub_char(word[pos], {0: 0, 1: 1, 5: 2}[kind], rng)
            return [word[:pos] + new + word[pos + 1 :]]
        if kind == 2:
            return ["".join(self._sub_char(c, 0, rng) for c in word)]
        if kind == 3:
            if len(word) < 2:
                return None
            cut = rng.randrange(1, len(word))
            return [word[:cut], word[cut:]]
        if kind == 4:
            return [] if word in DROPPABLE else None
        return None

    def utter(self, sentence: str, rng: random.Random) -> str:
        """Return what the speaker said: the sentence, sometimes with a filler (see `utter`)."""
        return utter(sentence, rng, self.config.p_spoken_filler)

    def sample(self, sentence: str, rng: random.Random, phones: bool = False) -> tuple[NBest, str]:
        """Return an n-best list of what was said and its truth (spaces removed): `utter`, then `simulate`."""
        said = self.utter(sentence, rng)
        return self.simulate(said, rng, phones=phones), "".join(said.split())

    def _filler_slot(self, word: str, rng: random.Random) -> list[tuple[float, tuple[str, ...]]]:
        """A said filler: heard, or dropped (in TOP1 with p_filler_dropped, else lower in the list)."""
        pen = -abs(rng.gauss(0.0, self.config.score_spread)) - 0.05
        if rng.random() < self.config.p_filler_dropped:
            return [(0.0, ()), (pen, (word,))]
        return [(0.0, (word,)), (pen, ())] if rng.random() < 0.5 else [(0.0, (word,))]

    def _slot(self, word: str, rng: random.Random) -> list[tuple[float, tuple[str, ...]]]:
        """Return the scored spellings of one word position, best first."""
        cfg = self.config
        if word in SPOKEN_FILLERS and len(word) == 1:
            return self._filler_slot(word, rng)
        truth = (word,)
        if rng.random() < cfg.p_certain_error:
            wrong = self._corrupt(word, rng)
            if wrong is not None and "".join(wrong) != word:
                truth = tuple(wrong)  # the truth is not offered at this position
        options = {truth: 0.0}
        if rng.random() < cfg.p_uncertain:
            for _ in range(rng.choice(cfg.alternatives)):
                alt = self._corrupt(word, rng)
                if alt is None or tuple(alt) in options:
                    continue
                options[tuple(alt)] = -abs(rng.gauss(0.0, cfg.score_spread)) - 0.05
            if len(options) > 1 and rng.random() < cfg.p_top1_wrong:
                best_alt = max((k for k in options if k != truth), key=lambda k: options[k])
                options[best_alt], options[truth] = 0.0, -abs(rng.gauss(0.0, cfg.score_spread)) - 0.05
        ranked = sorted(((s, k) for k, s in options.items()), key=lambda p: -p[0])
        if rng.random() < cfg.p_filler:
            filler = rng.choice(FILLERS)
            pen = abs(rng.gauss(0.0, cfg.score_spread))
            with_filler = [(s - pen, (filler, *k)) for s, k in ranked]
            if rng.random() < 0.25:  # the filler wins in TOP1
                ranked = [(s + 2 * pen, k) for s, k in with_filler] + ranked
            else:
                ranked = ranked + with_filler
            ranked.sort(key=lambda p: -p[0])
        return ranked

    def simulate(self, sentence: str, rng: random.Random, phones: bool = False) -> NBest:
        """Return a simulated n-best list for one space-segmented sentence."""
        slots = [self._slot(w, rng) for w in sentence.split()]
        hyps = k_best(slots, self.config.n_best)
        sentences = tuple(" ".join(h) for h in hyps if any(h))
        if not sentences:
            sentences = (sentence,)
        phonemes = tuple(text_phones(s) for s in sentences) if phones else ()
        return NBest(sentences, phonemes)


def k_best(slots: list[list[tuple[float, tuple[str, ...]]]], k: int) -> list[list[str]]:
    """Return the k best combinations of independent ranked slots, as word lists, distinct by text."""
    start = (0,) * len(slots)
    best = sum(slot[0][0] for slot in slots)
    heap = [(-best, start)]
    seen = {start}
    out: list[list[str]] = []
    texts: set[str] = set()
    while heap and len(out) < k:
        neg, idx = heapq.heappop(heap)
        words = [w for slot, i in zip(slots, idx, strict=True) for w in slot[i][1]]
        text = " ".join(words)
        if text not in texts:
            texts.add(text)
            out.append(words)
        for j, i in enumerate(idx):
            if i + 1 < len(slots[j]):
                nxt = idx[:j] + (i + 1,) + idx[j + 1 :]
                if nxt not in seen:
                    seen.add(nxt)
                    score = -neg - slots[j][i][0] + slots[j][i + 1][0]
                    heapq.heappush(heap, (-score, nxt))
    return out


def cer_counts(hyp: str, ref: str) -> tuple[int, int]:
    """Return (edit distance, reference length) at the character level."""
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.distance(hyp, ref), len(ref)


def statistics(sim: Simulator, sentences: list[str], seed: int = 0) -> dict[str, float]:
    """Measure TOP1 CER, n-best oracle CER, list sizes and how often the truth is in the list."""
    rng = random.Random(seed)
    top1_err = oracle_err = total = in_list = n_hyps = top1_right = 0
    for sent in sentences:
        said = sim.utter(sent, rng)
        ref = said.replace(" ", "")
        nb = sim.simulate(said, rng)
        hyps = [h.replace(" ", "") for h in nb.sentences]
        e, n = cer_counts(hyps[0], ref)
        top1_err += e
        total += n
        top1_right += e == 0
        oracle_err += min(cer_counts(h, ref)[0] for h in hyps)
        in_list += ref in hyps
        n_hyps += len(hyps)
    m = max(len(sentences), 1)
    return {
        "sentences": len(sentences),
        "top1_cer": top1_err / max(total, 1),
        "oracle_cer": oracle_err / max(total, 1),
        "truth_in_list": in_list / m,
        "top1_sentence_right": top1_right / m,
        "mean_hypotheses": n_hyps / m,
    }


def load_simulator(corpus_dir: Path, config: SimConfig = DEFAULT) -> Simulator:
    """Build a simulator from the corpus's training lexicon."""
    lexicon = json.loads((corpus_dir / "lexicon.json").read_text(encoding="utf-8"))
    counts: dict[str, int] = {}
    for word, n in lexicon.items():
        for c in word:
            counts[c] = counts.get(c, 0) + n
    vocab = [c for c, _ in sorted(counts.items(), key=lambda kv: -kv[1])]
    return Simulator(ConfusionSet(counts), vocab, config)


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the simulator's statistics.")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("-n", type=int, default=3000)
    args = parser.parse_args()
    for name, cfg, split in (("default", DEFAULT, "dev"), ("reviews", REVIEWS, "reviews")):
        sim = load_simulator(args.corpus, cfg)
        sents = (args.corpus / f"{split}.txt").read_text(encoding="utf-8").split("\n")[: args.n]
        stats = statistics(sim, [s for s in sents if s], seed=1)
        print(name, json.dumps({k: round(v, 4) for k, v in stats.items()}))
    sim = load_simulator(args.corpus, DEFAULT)
    example = sim.simulate(sents[0], random.Random(3), phones=True)
    print(json.dumps({"sentence_list": example.sentences, "phoneme_sequence_list": example.phonemes[:2]},
                     ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()


