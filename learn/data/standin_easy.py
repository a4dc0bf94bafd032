"""The easy stand-in (`python -m learn.data.standin --profile easy`): product reviews through `learn.data.decode_sim`'s
decoding recogniser, with a transcriber layer: the truths write one orthographic variant where the recogniser writes
the other (`VARIANT_CONVENTIONS`), one spoken filler where it writes another (`FILLER_CONVENTIONS`), and the words
most over-represented in reviews against news are heard, each consistently, as one homophone in `p_domain_error` of
the hypotheses. Far easier than real data: few distinct rewrites, most repeated.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from preprocess.confusion import SAME_TONE
from learn.data.decode_sim import DecodingSimulator
from learn.data.labelled import Labelled
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
