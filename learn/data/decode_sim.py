"""Decoding n-best simulator: beam search over a sound-alike lattice under the review text's language model.

A real recogniser's errors are fluent under its own language model, while learn.data.simulate makes
independent word-level ones. Here every syllable of the truth offers its same- and near-syllable characters
(ConfusionSet.similar), every stretch of one or two truth words its same- and near-sounding lexicon words (the
recogniser's lexicon: every word seen twice in the corpus, so its vocabulary covers the text), and now and
then a function word or filler may be dropped or inserted. Each candidate pays a noisy acoustic cost, drawn
per position and per syllable (homophones sound the same, so only the language model tells them apart), plus
a character bigram cost of the review text, which the corrector never sees. A beam search keeps the 10 best
distinct sentences, spaced as decoded: a lexicon word is one word, a lone character is its own.

`python -m learn.data.decode_sim` prints the statistics on the news test split and on held-out reviews.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from operator import add
from pathlib import Path

from preprocess.confusion import ConfusionSet, near_toneless
from preprocess.phones import Syllable, char_syllable, text_phones
from learn.data.simulate import DROPPABLE, FILLERS, statistics, utter
from preprocess.text import SPOKEN_FILLERS, NBest

REVIEW_HOLDOUT = 5000  # the first reviews are for evaluation and never counted into the language model
BOS, EOS = "<", ">"
MAX_WORD_CHARS = 4
MIN_WORD_COUNT = 2
SPLITS = ("train", "dev", "test", "reviews")

Arc = tuple[int, str, float]  # end position, text ("" drops a word), acoustic cost
AcousticCost = Callable[[int, str], "float | None"]  # (position, character) -> cost, None when it sounds unlike


@dataclass(frozen=True)
class DecodeConfig:
    """Knobs of the decoding recogniser, costs in nats (the defaults aim at TOP1 CER about 9 %)."""

    n_best: int = 10
    beam: int = 12  # hypotheses kept per lattice position
    lm_weight: float = 0.6
    noise: float = 1.0  # sd of the acoustic noise of one syllable at one position
    p_unclear: float = 0.08  # a position is acoustically unclear: its noise is scaled
    unclear_scale: float = 3.0
    tone_cost: float = 3.5  # same syllable, other tone
    near_cost: float = 5.0  # one initial or final swap away (zh/z, n/l, -n/-ng, ...)
    word_bonus: float = 3.5  # per character of a multi-character lexicon word: the recogniser's word LM
    candidates: int = 10  # sound-alike characters per position
    homophones: int = 4  # sound-alike lexicon words per syllable sequence
    p_drop: float = 0.08  # a function word or spoken filler may be dropped
    p_insert: float = 0.02  # a filler or function word may be inserted before a word
    drop_cost: float = 3.0
    insert_cost: float = -3.0  # below 0: an inserted filler must still beat the LM's dislike of it
    lm_k: float = 0.1  # add-k of the unigram under the Witten-Bell bigram
    p_spoken_filler: float = 0.08  # `utter`: a sentence is said with a filler (a spoken filler sounds like no
    # word, so it is heard as itself, or dropped where p_drop offers that)


DEFAULT = DecodeConfig()


class _Memo(dict[str, float]):
    """A dict that computes a missing value with `compute(key)` and keeps it."""

    def __init__(self, compute: Callable[[str], float]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key: str) -> float:
        value = self[key] = self._compute(key)
        return value


class CharBigram:
    """Character bigram, Witten-Bell interpolated with an add-k unigram that keeps one slot for unseen characters."""

    def __init__(self, sentences: Iterable[str], k: float = 0.1) -> None:
        self.unigrams: Counter[str] = Counter()
        self._bigrams: Counter[str] = Counter()
        for sent in sentences:
            text = BOS + sent.replace(" ", "") + EOS
            self.unigrams.update(text[1:])
            self._bigrams.update(map(add, text, text[1:]))
        self._context: Counter[str] = Counter()
        self._types: Counter[str] = Counter()
        for pair, n in self._bigrams.items():
            self._context[pair[0]] += n
            self._types[pair[0]] += 1
        self._k = k
        self._unigram_total = sum(self.unigrams.values()) + k * (len(self.unigrams) + 1)
        # prev + text -> -ln P(text | prev), filled on demand: the beam search asks for the same pairs over and over
        self.costs = _Memo(lambda key: -sum(math.log(self.prob(a, b)) for a, b in zip(key, key[1:], strict=False)))

    def prob(self, prev: str, char: str) -> float:
        """Return P(char | prev)."""
        p_uni = (self.unigrams[char] + self._k) / self._unigram_total
        n, types = self._context[prev], self._types[prev]
        return (self._bigrams[prev + char] + types * p_uni) / (n + types) if n else p_uni

    def cost(self, prev: str, text: str) -> float:
        """Return -ln P(text | prev), one character after another (prev is one character, or BOS)."""
        return self.costs[prev + text]


class DecodingSimulator:
    """Make n-best lists by decoding a noisy sound-alike lattice of a clean sentence."""

    def __init__(self, lm: CharBigram, lexicon: Mapping[str, int], config: DecodeConfig = DEFAULT) -> None:
        self.lm = lm
        self.config = config
        self.confusion = ConfusionSet({c: n for c, n in lm.unigrams.items() if c != EOS})
        self._words: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for word, _n in sorted(lexicon.items(), key=lambda kv: -kv[1]):
            syls = [char_syllable(c) for c in word]
            if 2 <= len(word) <= MAX_WORD_CHARS and all(syls):
                self._words[tuple(s.toneless for s in syls if s)].append(word)
        self._lexicon = frozenset(lexicon)

    @classmethod
    def from_sentences(cls, lm_sentences: Iterable[str], lexicon: Mapping[str, int],
                       config: DecodeConfig = DEFAULT) -> DecodingSimulator:
        """Build a recogniser whose LM counts `lm_sentences` and whose words are the lexicon's."""
        return cls(CharBigram(lm_sentences, config.lm_k), lexicon, config)

    @classmethod
    def from_corpus(cls, corpus_dir: Path, config: DecodeConfig = DEFAULT) -> DecodingSimulator:
        """Build the recogniser from the corpus: the reviews' LM (held-out reviews left out), the corpus's words."""
        splits = {name: (corpus_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n") for name in SPLITS}
        # a real recogniser's vocabulary covers the language it hears (only its LM is foreign): every word
        # seen twice anywhere in the corpus, so that most one-off names stay out of it
        counts = Counter(w for lines in splits.values() for line in lines for w in line.split() if len(w) > 1)
        lexicon = {w: n for w, n in counts.items() if n >= MIN_WORD_COUNT}
        return cls.from_sentences((s for s in splits["reviews"][REVIEW_HOLDOUT:] if s), lexicon, config)

    def _base_cost(self, truth: Syllable, heard: Syllable) -> float | None:
        """Return the acoustic cost of hearing `heard` for `truth` before noise, None when they sound unlike."""
        tone = 0.0 if heard.tone == truth.tone else self.config.tone_cost
        if heard.toneless == truth.toneless:
            return tone
        if heard.toneless in near_toneless(truth):
            return self.config.near_cost + tone
        return None

    def _acoustic(self, truths: list[Syllable | None], rng: random.Random) -> AcousticCost:
        """Return cost(position, character): a noisy acoustic model of the truth's syllables, None when unlike."""
        cfg = self.config
        scales = [cfg.noise * (cfg.unclear_scale if rng.random() < cfg.p_unclear else 1.0) for _ in truths]
        memo: dict[tuple[int, Syllable], float | None] = {}

        def cost(pos: int, char: str) -> float | None:
            truth, heard = truths[pos], char_syllable(char)
            if truth is None or heard is None:
                return None
            key = (pos, heard)
            if key not in memo:
                base = self._base_cost(truth, heard)
                memo[key] = None if base is None else base + rng.gauss(0.0, scales[pos])
            return memo[key]

        return cost

    def _lattice(self, words: list[str], rng: random.Random) -> tuple[list[list[Arc]], dict[int, tuple[str, float]]]:
        """Return the arcs leaving each character position, and the (word, cost) insertable before some."""
        cfg = self.config
        chars = "".join(words)
        truths = [char_syllable(c) for c in chars]
        cost = self._acoustic(truths, rng)
        arcs: list[list[Arc]] = [[] for _ in chars]
        for pos, char in enumerate(chars):
            own = cost(pos, char)
            arcs[pos].append((pos + 1, char, 0.0 if own is None else own))
            if char in SPOKEN_FILLERS or own is None:
                continue
            for alt, _rel in self.confusion.similar(char, cfg.candidates):
                c = cost(pos, alt)
                if c is not None:
                    arcs[pos].append((pos + 1, alt, c))
        starts = [sum(map(len, words[:i])) for i in range(len(words))]
        inserts: dict[int, tuple[str, float]] = {}
        for i, (word, start) in enumerate(zip(words, starts, strict=True)):
            if (word in DROPPABLE or word in SPOKEN_FILLERS) and rng.random() < cfg.p_drop:
                arcs[start].append((start + 1, "", cfg.drop_cost + rng.gauss(0.0, cfg.noise)))
            if rng.random() < cfg.p_insert:
                inserts[start] = (rng.choice(FILLERS), cfg.insert_cost + rng.gauss(0.0, cfg.noise))
            spans = [word] if len(word) > 1 else []
            pair = words[i : i + 2]
            if len(pair) == 2 and not SPOKEN_FILLERS & set(pair):  # a word heard across two, never across a filler
                spans.append("".join(pair))
            for span in spans:
                arcs[start] += self._word_arcs(span, start, truths, cost)
        return arcs, inserts

    def _word_arcs(self, span: str, start: int, truths: list[Syllable | None], cost: AcousticCost) -> list[Arc]:
        """Return the lexicon words sounding like `span` (same syllables, or one near syllable) as arcs."""
        syls = truths[start : start + len(span)]
        if not 2 <= len(span) <= MAX_WORD_CHARS or not all(syls):
            return []
        toneless = [s.toneless for s in syls if s]
        keys = [tuple(toneless)] + [
            (*toneless[:i], near, *toneless[i + 1 :]) for i, s in enumerate(syls) if s for near in near_toneless(s)
        ]
        found = [span] if span in self._lexicon else []
        found += [w for key in keys for w in self._words.get(key, ())[: self.config.homophones] if w != span]
        out: list[Arc] = []
        for word in found:
            costs = [cost(start + i, c) for i, c in enumerate(word)]
            if all(c is not None for c in costs):
                total = sum(c for c in costs if c is not None) - self.config.word_bonus * len(word)
                out.append((start + len(word), word, total))
        return out

    def scored(self, sentence: str, rng: random.Random) -> list[tuple[float, str]]:
        """Return the n best distinct decodings of one space-segmented sentence, as (cost, text), best first."""
        cfg = self.config
        arcs, inserts = self._lattice(sentence.split(), rng)
        # one bucket per position: hypotheses by their characters (so one spelling keeps only its best spacing)
        buckets: list[dict[str, tuple[float, str]]] = [{} for _ in range(len(arcs) + 1)]
        buckets[0][""] = (0.0, "")
        for pos, bucket in enumerate(buckets[:-1]):
            if pos in inserts:
                self._extend(bucket, list(bucket.items()), *inserts[pos])
            kept = heapq.nsmallest(cfg.beam, bucket.items(), key=lambda kv: kv[1][0])
            for end, word, c in arcs[pos]:
                self._extend(buckets[end], kept, word, c)
        final = [(score + cfg.lm_weight * self.lm.cost(key[-1:] or BOS, EOS), text)
                 for key, (score, text) in buckets[-1].items() if key]
        return heapq.nsmallest(cfg.n_best, final)

    def _extend(self, bucket: dict[str, tuple[float, str]], hyps: list[tuple[str, tuple[float, str]]], word: str,
                acoustic: float) -> None:
        """Add hypotheses extended by `word` to a bucket, keeping each spelling's cheapest."""
        costs, lm_weight = self.lm.costs, self.config.lm_weight
        for key, (score, text) in hyps:
            new = score + acoustic + lm_weight * costs[(key[-1:] or BOS) + word]
            old = bucket.get(key + word)
            if old is None or new < old[0]:
                bucket[key + word] = (new, f"{text} {word}" if text and word else text or word)

    def utter(self, sentence: str, rng: random.Random) -> str:
        """Return what the speaker said: the sentence, sometimes with a filler (see `simulate.utter`)."""
        return utter(sentence, rng, self.config.p_spoken_filler)

    def sample(self, sentence: str, rng: random.Random, phones: bool = True) -> tuple[NBest, str]:
        """Return an n-best list of what was said and its truth (spaces removed): `utter`, then `simulate`."""
        said = self.utter(sentence, rng)
        return self.simulate(said, rng, phones=phones), "".join(said.split())

    def simulate(self, sentence: str, rng: random.Random, phones: bool = True) -> NBest:
        """Return a decoded n-best list (and its phone strings) for one space-segmented sentence."""
        sentences = tuple(text for _cost, text in self.scored(sentence, rng)) or (sentence,)
        return NBest(sentences, tuple(text_phones(s) for s in sentences) if phones else ())


def decoded_dev(corpus: Path, n: int, skip: int, seed: int) -> tuple[list[NBest], list[str]]:
    """Dev lists of the decoding recogniser for fitting the second stage (`learn.tune --decoded-sentences`):
    sound-alike spans fluent under its own language model, each lower hypothesis another reading of one or two of
    them, as a real decoder's lists are (issue 60). Drawn from the dev split's sentences after the first `skip` (those
    the simulated dev lists use)."""
    sim = DecodingSimulator.from_corpus(corpus, DecodeConfig())
    rng = random.Random(seed)
    sents = [s for s in (corpus / "dev.txt").read_text(encoding="utf-8").split("\n") if s][skip : skip + n]
    pairs = [sim.sample(s, rng, phones=True) for s in sents]
    return [nb for nb, _ in pairs], [t for _, t in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the decoding simulator's statistics.")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="KNOB=VALUE", help="override DecodeConfig knobs")
    args = parser.parse_args()
    knobs = dict(kv.split("=", 1) for kv in args.set)
    config = replace(DEFAULT, **{k: type(getattr(DEFAULT, k))(v) for k, v in knobs.items()})
    t0 = time.perf_counter()
    sim = DecodingSimulator.from_corpus(args.corpus, config)
    print(f"built in {time.perf_counter() - t0:.1f} s")
    for name, split in (("news test", "test"), ("reviews (held out)", "reviews")):
        lines = (args.corpus / f"{split}.txt").read_text(encoding="utf-8").split("\n")
        sents = [s for s in lines[: min(args.n, REVIEW_HOLDOUT)] if s]
        t0 = time.perf_counter()
        stats = statistics(sim, sents, seed=args.seed)  # type: ignore[arg-type]  # same simulate() signature
        stats["seconds_per_1000"] = (time.perf_counter() - t0) * 1000 / max(len(sents), 1)
        print(name, json.dumps({k: round(v, 4) for k, v in stats.items()}))
    example = sim.simulate(sents[0], random.Random(3))
    print(json.dumps({"truth": sents[0], "sentence_list": example.sentences}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
