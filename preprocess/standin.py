"""A stand-in for a team's labelled file: `python -m preprocess.standin --out DIR`.

No real labelled list ships with the project, so `model.adapt` is measured on lists made differently from what
the shipped model was trained on (our word-lattice simulator on news text):

- **the recogniser** is `preprocess.decode_sim`'s decoding recogniser (fluent errors under its own character
  bigram), on product-review clauses (a domain the shipped model never saw; the first REVIEW_HOLDOUT reviews,
  which `model.evaluate`'s `reviews` set uses, are left out);
- **a transcriber layer** on top, as the issue describes real files: the truths write
  - one orthographic variant where the recogniser writes the other (`VARIANT_CONVENTIONS`: 臺/台, 汙/污, 溼/濕, and
    the word 甚麼/什麼),
  - one spoken filler where the recogniser writes another (`FILLER_CONVENTIONS`: 呃/痾, 欸/誒),
  - and `domain_words` words of the domain (the words most over-represented in review text against the news
    training text) are heard, each consistently, as one frequent homophone (a character swapped for the
    commonest other character of its syllable) in `p_domain_error` of the hypotheses.

Two versions of the same lists: `nbest_*.jsonl` (up to 10 hypotheses with phone strings) and `top1_*.jsonl`
(TOP1 alone, no phones). `*_train.jsonl` and `*_test.jsonl` come from disjoint clauses; a learning curve adapts on
the first N rows of the train file and scores the test file. Seeded; the rates were set once from the issue's
description of real files, not tuned to any figure.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from preprocess.confusion import SAME_TONE
from preprocess.decode_sim import REVIEW_HOLDOUT, DecodingSimulator
from preprocess.labelled import Labelled, write_labelled
from preprocess.phones import text_phones
from preprocess.text import NBest

# (what the truths write, what the recogniser writes)
VARIANT_CONVENTIONS = (("臺", "台"), ("汙", "污"), ("溼", "濕"), ("甚麼", "什麼"))
FILLER_CONVENTIONS = (("呃", "痾"), ("欸", "誒"))


@dataclass(frozen=True)
class Transcribers:
    """The transcriber layer: conventions, and the domain words the recogniser hears as homophones."""

    domain_words: int = 40
    p_domain_error: float = 0.6  # per hypothesis, independently: the word is written as its homophone
    min_domain_count: int = 30  # a domain word appears at least this often in the stand-in's text


def domain_homophones(domain_lines: list[str], general_lines: list[str], sim: DecodingSimulator,
                      config: Transcribers) -> dict[str, str]:
    """Pick the words most over-represented in the domain, each with the homophone the recogniser writes."""
    domain = Counter(w for line in domain_lines for w in line.split() if 2 <= len(w) <= 3)
    general = Counter(w for line in general_lines for w in line.split() if 2 <= len(w) <= 3)
    d_total, g_total = sum(domain.values()) or 1, sum(general.values()) or 1
    ratio = {w: (n / d_total) / ((general[w] + 1) / g_total) for w, n in domain.items()
             if n >= config.min_domain_count}
    out: dict[str, str] = {}
    for word in sorted(ratio, key=lambda w: -ratio[w]):
        homophone = _homophone(word, sim)
        if homophone is not None:
            out[word] = homophone
        if len(out) >= config.domain_words:
            break
    return out


def _homophone(word: str, sim: DecodingSimulator) -> str | None:
    """The word with one character swapped for the commonest other character of the same syllable and tone."""
    best: tuple[int, int, str] | None = None
    for i, char in enumerate(word):
        same = [alt for alt, relation in sim.confusion.similar(char, 4) if relation == SAME_TONE]
        if same:
            n = sim.lm.unigrams[same[0]]
            if best is None or n > best[0]:
                best = (n, i, same[0])
    if best is None:
        return None
    _, i, alt = best
    return word[:i] + alt + word[i + 1 :]


def transcribe(truth: str) -> str:
    """Write what was said as the transcribers do (their variant forms)."""
    for theirs, recogniser in VARIANT_CONVENTIONS:
        truth = truth.replace(recogniser, theirs)
    return truth


def recognise(hypothesis: str, homophones: dict[str, str], rng: random.Random, p_domain_error: float) -> str:
    """Write a hypothesis as the recogniser does: its variant forms and fillers, domain words as homophones."""
    for theirs, recogniser in (*VARIANT_CONVENTIONS, *FILLER_CONVENTIONS):
        hypothesis = hypothesis.replace(theirs, recogniser)
    for word, homophone in homophones.items():
        if word in hypothesis and rng.random() < p_domain_error:
            hypothesis = hypothesis.replace(word, homophone)
    return hypothesis


def make_lists(sim: DecodingSimulator, sentences: list[str], homophones: dict[str, str], config: Transcribers,
               seed: int, prefix: str) -> list[Labelled]:
    """Decode each sentence, then pass truth and hypotheses through the transcriber layer."""
    rng = random.Random(seed)
    out = []
    for k, sentence in enumerate(sentences):
        nbest, truth = sim.sample(sentence, rng, phones=False)
        hyps = [recognise(h, homophones, rng, config.p_domain_error) for h in nbest.sentences]
        out.append(Labelled(f"{prefix}-{k}", transcribe(truth), NBest(tuple(hyps), tuple(map(text_phones, hyps)))))
    return out


def top1_only(items: list[Labelled]) -> list[Labelled]:
    """The same lists with TOP1 alone and no phone strings."""
    return [Labelled(it.id, it.truth, NBest(it.nbest.sentences[:1])) for it in items]


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the stand-in labelled files (two versions, train and test).")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--out", type=Path, default=Path("data/standin"))
    ap.add_argument("--train", type=int, default=20_000, help="lists in the train files")
    ap.add_argument("--test", type=int, default=2_000, help="lists in the test files (other clauses)")
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args()
    if not (args.corpus / "reviews.txt").exists():
        from preprocess.corpus import build, write

        write(build(), args.corpus)
    t0 = time.perf_counter()
    config = Transcribers()
    sim = DecodingSimulator.from_corpus(args.corpus)
    reviews = [s for s in (args.corpus / "reviews.txt").read_text(encoding="utf-8").split("\n")[REVIEW_HOLDOUT:] if s]
    news = [s for s in (args.corpus / "train.txt").read_text(encoding="utf-8").split("\n") if s]
    random.Random(args.seed).shuffle(reviews)
    homophones = domain_homophones(reviews, news, sim, config)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {"test": reviews[: args.test], "train": reviews[args.test : args.test + args.train]}
    for name, sentences in parts.items():
        items = make_lists(sim, sentences, homophones, config, args.seed + (name == "test"), f"standin-{name}")
        write_labelled(items, args.out / f"nbest_{name}.jsonl")
        write_labelled(top1_only(items), args.out / f"top1_{name}.jsonl")
    (args.out / "transcribers.json").write_text(json.dumps(
        {"variants": VARIANT_CONVENTIONS, "fillers": FILLER_CONVENTIONS, "domain_homophones": homophones,
         "config": asdict(config)}, ensure_ascii=False, indent=1),
        encoding="utf-8")
    print(f"wrote {args.out}: {len(parts['train'])} train and {len(parts['test'])} test lists, two versions, "
          f"{len(homophones)} domain words, in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
