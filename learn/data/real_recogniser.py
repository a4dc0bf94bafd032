"""The calibrated stand-in's recogniser (`RealRecogniser`, its knobs in `learn.data.real_profile.RealConfig`): it
makes a truth's 10-best list with the real data's error mix (`REAL`) and repetition, from a seeded inventory of
systematic rewrites (`Rewrite`) and one-off spans of each class, spaced as the truth's words (`render`). How it is
made: `learn.data.standin`'s docstring; the truths it hears: `learn.data.standin_real`.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence

from learn.data.decode_sim import BOS, EOS, CharBigram
from learn.data.focused import Stretches
from learn.data.real_profile import (
    FILLER_SWAPS,
    NAMED_REWRITES,
    SPAN_LENGTHS,
    SPAN_MIX,
    VARIANT_FORMS,
    Edit,
    RealConfig,
    Rewrite,
    render,
)
from learn.error_stats import SPAN_CLASSES, classify_span, simplified
from preprocess.confusion import ConfusionSet, near_toneless
from preprocess.phones import char_syllable
from preprocess.text import SPOKEN_FILLERS


class RealRecogniser:
    """Makes a truth's 10-best list with the real data's error mix and repetition (see the module docstring)."""

    def __init__(self, char_counts: Counter[str], word_counts: Counter[str], sample: Sequence[str],
                 config: RealConfig, seed: int, lm_text: Sequence[str] | None = None,
                 sentence_cost: Callable[[str], float] | None = None) -> None:
        self.config = config
        self.confusion = ConfusionSet(char_counts)
        common = [c for c, _ in char_counts.most_common(3000) if char_syllable(c) and c not in SPOKEN_FILLERS]
        self._common = common
        self._common_cum = list(itertools.accumulate(1 / (i + 10) for i in range(len(common))))
        words = [(w, n) for w, n in word_counts.most_common(20000)
                 if not set(w) & SPOKEN_FILLERS and all(char_syllable(c) for c in w)]
        self._words_by_len: dict[int, tuple[list[str], list[float]]] = {}
        for n in range(1, 5):
            ws = [(w, c) for w, c in words if len(w) == n]
            self._words_by_len[n] = ([w for w, _ in ws], list(itertools.accumulate(c**0.75 for _, c in ws)))
        self._alt_cache: dict[tuple[str, str], list[str]] = {}
        # corpus words by their toneless syllables, for fluent word-for-word errors
        self._by_sound: dict[tuple[str, ...], list[tuple[str, float]]] = {}
        self._word_weight = {w: c**0.75 for w, c in words}
        for w, c in words:
            if len(w) <= 3:
                key = tuple(char_syllable(ch).toneless for ch in w)  # type: ignore[union-attr]
                self._by_sound.setdefault(key, []).append((w, c**0.75))
        # the recogniser's own language models: a character bigram of corpus text, built only when a knob asks for
        # decoded errors, and the whole-sentence cost its fluent errors are drawn by (-ln P, `sentence_cost`)
        self.lm = CharBigram(lm_text if lm_text is not None else sample) if config.p_decoded else None
        self.sentence_cost = sentence_cost
        if config.p_fluent and sentence_cost is None:
            raise ValueError("fluent errors (p_fluent) need the recogniser's sentence_cost")
        rng = random.Random(seed)
        self.inventory = self._inventory(words, sample, rng)
        self._by_first: dict[str, list[Rewrite]] = {}
        self._always: list[Rewrite] = []
        for r in self.inventory:
            if r.said:
                self._by_first.setdefault(r.said[0], []).append(r)
            else:
                self._always.append(r)
        self.realised: Counter[str] = Counter()  # spans made so far, by class: the mix is steered by it

    # -- sound-alike characters ------------------------------------------------------------------------------
    def _alternatives(self, char: str, kind: str) -> list[str]:
        """Characters that sound like `char` in the way of `kind` (homophone / near), commonest first."""
        key = (char, kind)
        if key not in self._alt_cache:
            pool = self.confusion.same_syllable(char) if kind == "homophone" else self.confusion.near_syllable(char)
            self._alt_cache[key] = [c for c in pool if c not in SPOKEN_FILLERS and simplified(c) != simplified(char)
                                    and self.confusion.count(c) >= 3][:12]
        return self._alt_cache[key]

    def _sounds_alike(self, char: str, kind: str, rng: random.Random) -> str | None:
        alts = self._alternatives(char, kind)
        if not alts:
            return None
        if self.config.common_writing:  # a decoder's LM pulls towards what is commoner than what was said
            commoner = [c for c in alts if self.confusion.count(c) > self.confusion.count(char)]
            return rng.choices(commoner, [self.confusion.count(c) for c in commoner])[0] if commoner else None
        return alts[min(int(rng.expovariate(0.5)), len(alts) - 1)]

    def _other_char(self, char: str, rng: random.Random) -> str:
        """A common character whose sound is neither the same nor near (the `other` class)."""
        for _ in range(20):
            c = self._common[bisect.bisect(self._common_cum, rng.random() * self._common_cum[-1])]
            if classify_span(c, char) == "other":
                return c
        return "麼" if char != "麼" else "嗎"

    def _word(self, n: int, rng: random.Random) -> str:
        ws, cum = self._words_by_len[n]
        return ws[bisect.bisect(cum, rng.random() * cum[-1])]

    # -- spans of each class on a given stretch --------------------------------------------------------------
    def written_as(self, cls: str, said: str, rng: random.Random) -> str | None:
        """How the recogniser writes `said` in a span of class `cls` (None when it cannot)."""
        if cls == "homophone":
            out = [self._sounds_alike(c, "homophone", rng) for c in said]
            return None if None in out else "".join(out)  # type: ignore[arg-type]
        if cls == "near":
            must = rng.randrange(len(said))
            out = [self._sounds_alike(c, "near" if i == must or rng.random() < 0.5 else "homophone", rng)
                   for i, c in enumerate(said)]
            return None if None in out else "".join(out)  # type: ignore[arg-type]
        if cls == "other":
            return "".join(self._other_char(c, rng) for c in said)
        if cls == "dropped":
            return ""
        if cls == "other_length":
            n = len(said)
            m = rng.choice([k for k in range(max(1, n - 2), n + 2) if k != n])
            out = [self._sounds_alike(c, "homophone", rng) or self._other_char(c, rng) for c in said[:m]]
            return "".join(out) + "".join(self._other_char(said[-1], rng) for _ in range(m - len(out)))
        if cls == "filler":
            return rng.choice(FILLER_SWAPS.get(said, ("",)) + ("",)) if said in SPOKEN_FILLERS else None
        if cls == "variant":
            return VARIANT_FORMS.get(said)
        raise ValueError(f"no such class {cls}")

    def heard_otherwise(self, cls: str, truth: str, start: int, end: int, rng: random.Random) -> str | None:
        """How a lower hypothesis hears truth[start:end] (issue 60): half the time a corpus word sounding so (a fluent
        recogniser's drawn by its LM's liking), else its own writing, else sound-alike characters by rank."""
        said = truth[start:end]
        words = self.sound_alike_words(cls, said, most=12)
        if words and rng.random() < 0.5:
            if self.config.p_fluent and self.sentence_cost is not None:
                costs = [self.sentence_cost(truth[:start] + w + truth[end:]) for w, _ in words]
                return rng.choices([w for w, _ in words], [math.exp(min(costs) - c) for c in costs])[0]
            return rng.choices([w for w, _ in words], [c for _, c in words])[0]
        got = self.written_as(cls, said, rng)
        alts = [self._alternatives(c, "homophone") for c in said]
        if got is None and all(alts):
            got = "".join(a[min(int(rng.expovariate(0.5)), len(a) - 1)] for a in alts)
        return got

    def other_word(self, said: str, rng: random.Random) -> str | None:
        """A corpus word of `said`'s length that sounds neither the same nor near, by frequency (or None)."""
        for _ in range(10):
            w = self._word(len(said), rng)
            if classify_span(w, said) == "other":
                return w
        return None

    def sound_alike_words(self, cls: str, said: str, most: int = 40) -> list[tuple[str, float]]:
        """Corpus words (with their weights) sounding as `cls` (homophone or near) says to the word `said`, the
        `most` commonest."""
        syls = [char_syllable(c) for c in said]
        if any(s is None for s in syls):
            return []
        keys: list[tuple[str, ...]] = [tuple(s.toneless for s in syls)]  # type: ignore[union-attr]
        if cls == "near":
            keys = [keys[0][:i] + (alt,) + keys[0][i + 1 :] for i, s in enumerate(syls)
                    for alt in near_toneless(s)]  # type: ignore[arg-type]
        pool = [(w, c) for key in keys for w, c in self._by_sound.get(key, ()) if w != said
                and classify_span(w, said) == cls]
        return sorted(pool, key=lambda wc: -wc[1])[:most]

    def _fluent(self, cls: str, truth: str, bounds: list[tuple[int, int]], taken: list[Edit],
                rng: random.Random) -> Edit | None:
        """A whole truth word heard as another corpus word of class `cls`: of every such word at every free place,
        drawn with weight exp(gain), the gain how much more likely the recogniser's language model finds the
        sentence with it than what was said (a decoder's error: its LM pulled it there)."""
        assert self.sentence_cost is not None
        base = self.sentence_cost(truth)
        options: list[tuple[float, Edit]] = []
        for i, j in bounds:
            said = truth[i:j]
            if j - i > 3 or set(said) & SPOKEN_FILLERS or not _free((i, j, ""), taken, len(truth)):
                continue
            if cls == "other":  # (dicts, not sets: the draw must not depend on the strings' hash order)
                alts = dict.fromkeys(w for w in (self.other_word(said, rng) for _ in range(5)) if w)
            else:
                floor = self._word_weight.get(said, 0.0) if self.config.common_writing else -1.0
                alts = dict.fromkeys(w for w, c in self.sound_alike_words(cls, said) if c > floor)
            options += [(base - self.sentence_cost(truth[:i] + w + truth[j:]), (i, j, w)) for w in alts]
        if not options:
            return None
        top = max(g for g, _ in options)
        return rng.choices([e for _, e in options], [math.exp(g - top) for g, _ in options])[0]

    def _decoded(self, cls: str, truth: str, starts: list[int], n: int, rng: random.Random) -> Edit | None:
        """Of `decoded_choices` writings of class `cls` drawn at each start, the one the recogniser's character
        bigram prefers most to what was said, between its neighbours (a decoder's error: its LM pulled it there)."""
        assert self.lm is not None
        best: tuple[float, Edit] | None = None
        for i in starts:
            j = i + n
            prev, nxt = (truth[i - 1] if i else BOS), (truth[j] if j < len(truth) else EOS)
            said = truth[i:j]
            base = self.lm.cost(prev, said + nxt)
            for _ in range(self.config.decoded_choices):
                w = self.written_as(cls, said, rng)
                if w is None or w == said or classify_span(w, said) != cls:
                    continue
                gain = base - self.lm.cost(prev, w + nxt)
                if best is None or gain > best[0]:
                    best = (gain, (i, j, w))
        return None if best is None else best[1]

    def _length(self, cls: str, rng: random.Random) -> int:
        lengths = SPAN_LENGTHS[cls]
        return rng.choices(list(lengths), list(lengths.values()))[0]

    # -- the systematic inventory ----------------------------------------------------------------------------
    def _inventory(self, words: list[tuple[str, int]], truths: Sequence[str], rng: random.Random) -> list[Rewrite]:
        """Seeded systematic rewrites: NAMED_REWRITES, then rewrites of frequent words of each class, Zipf-ranked."""
        cfg = self.config
        word_cum = list(itertools.accumulate(n**0.6 for _, n in words))
        made: dict[tuple[str, str], str] = {}
        mix = {c: SPAN_MIX[c] for c in ("homophone", "near", "other", "added", "dropped", "other_length")}
        while len(made) < cfg.inventory - len(NAMED_REWRITES):
            cls = rng.choices(list(mix), list(mix.values()))[0]
            n = self._length(cls, rng)
            if cls == "added":
                said, written = "", self._word(n, rng)
            else:
                word = words[bisect.bisect(word_cum, rng.random() * word_cum[-1])][0]
                if len(word) < (n if cls != "other_length" else max(1, n - 1)):
                    continue
                start = rng.randrange(len(word) - min(n, len(word)) + 1)
                said = word[start : start + n]
                got = self.written_as(cls, said, rng)
                if got is None:
                    continue
                written = got
            if (said, written) not in made and written != said and classify_span(written, said) == cls:
                made[(said, written)] = cls
        generated = list(made.items())
        rng.shuffle(generated)
        ranked: list[tuple[tuple[str, str], str]] = []
        named = [((s, w), classify_span(w, s)) for s, w in NAMED_REWRITES]
        for i in range(max(len(named), len(generated))):
            if i < len(named):
                ranked.append(named[i])
            if i < len(generated):
                ranked.append(generated[i])
        sample = [t.replace(" ", "") for t in truths]
        out = []
        for rank, ((said, written), cls) in enumerate(ranked):
            share = sum(said in t for t in sample) / max(len(sample), 1) if said else 1.0
            out.append(Rewrite(said, written, cls, (rank + 1) ** -cfg.zipf / max(share, 1 / max(len(sample), 1))))
        return out

    # -- one list ---------------------------------------------------------------------------------------------
    def _deficits(self) -> dict[str, float]:
        n = sum(self.realised.values()) + 1
        return {c: SPAN_MIX[c] * n - self.realised[c] for c in SPAN_CLASSES}

    def _systematic(self, truth: str, taken: list[Edit], rng: random.Random) -> Edit | None:
        deficits = self._deficits()
        applicable = [r for c in dict.fromkeys(truth) for r in self._by_first.get(c, ()) if r.said in truth]
        applicable = [r for r in applicable + self._always if deficits[r.cls] > -2]  # a class over its share waits
        while applicable:
            r = rng.choices(applicable, [r.weight for r in applicable])[0]
            places = [i for i in _occurrences(truth, r.said)] if r.said else list(range(len(truth) + 1))
            rng.shuffle(places)
            for i in places:
                edit = (i, i + len(r.said), r.written)
                if _free(edit, taken, len(truth)):
                    return edit
            applicable.remove(r)
        return None

    def _one_off(self, truth: str, taken: list[Edit], rng: random.Random, steer: bool = True,
                 bounds: list[tuple[int, int]] | None = None) -> Edit | None:
        deficits = self._deficits()
        classes = list(SPAN_CLASSES)
        weights = [max(deficits[c], 0.0) + 0.3 * SPAN_MIX[c] if steer else SPAN_MIX[c] for c in classes]
        while classes:
            k = rng.choices(range(len(classes)), weights)[0]
            cls = classes.pop(k)
            weights.pop(k)
            edit = self._span(cls, truth, taken, rng, bounds)
            if edit is not None:
                return edit
        return None

    def _span(self, cls: str, truth: str, taken: list[Edit], rng: random.Random,
              bounds: list[tuple[int, int]] | None = None) -> Edit | None:
        """A one-off span of class `cls` at a free place of the truth, or None (with the truth's word `bounds`, a
        fluent word-for-word error in `p_fluent` of the homophone, near and other spans)."""
        fluent, decoded = self.config.p_fluent, self.config.p_decoded  # 0: no draw, the lists as before issue 39
        if bounds and fluent and cls in ("homophone", "near", "other") and rng.random() < fluent:
            edit = self._fluent(cls, truth, bounds, taken, rng)
            if edit is not None:
                return edit
        if cls == "added":
            n = self._length(cls, rng)
            places = [i for i in range(len(truth) + 1) if _free((i, i, ""), taken, len(truth))]
            if not places:
                return None
            at = rng.choice(places)
            return (at, at, self._word(n, rng))
        if cls in ("filler", "variant"):
            table = SPOKEN_FILLERS if cls == "filler" else VARIANT_FORMS
            places = [i for i, c in enumerate(truth) if c in table and _free((i, i + 1, ""), taken, len(truth))]
            for i in rng.sample(places, len(places)):
                written = self.written_as(cls, truth[i], rng)
                if written is not None:
                    return (i, i + 1, written)
            return None
        n = self._length(cls, rng)
        starts = [i for i in range(len(truth) - n + 1)
                  if not set(truth[i : i + n]) & SPOKEN_FILLERS and _free((i, i + n, ""), taken, len(truth))]
        if decoded and cls in ("homophone", "near", "other") and rng.random() < decoded:
            decoded = self._decoded(cls, truth, starts, n, rng)
            if decoded is not None:
                return decoded
        for i in rng.sample(starts, min(len(starts), 4)):
            written = self.written_as(cls, truth[i : i + n], rng)
            if written is not None and classify_span(written, truth[i : i + n]) == cls:
                return (i, i + n, written)
        return None

    def top1_edits(self, truth: str, rng: random.Random, bounds: list[tuple[int, int]] | None = None) -> list[Edit]:
        """The TOP1's error spans on a truth (Han characters, no spaces; `bounds`: its words' [start, end))."""
        cfg = self.config
        if rng.random() >= cfg.p_wrong:
            return []
        n = rng.choices(range(1, len(cfg.spans_when_wrong) + 1), cfg.spans_when_wrong)[0]
        taken: list[Edit] = []
        for _ in range(n):
            edit = self._systematic(truth, taken, rng) if rng.random() < cfg.p_systematic else None
            if edit is None:
                edit = self._one_off(truth, taken, rng, bounds=bounds)
            if edit is None:
                break
            taken.append(edit)
            self.realised[classify_span(edit[2], truth[edit[0] : edit[1]])] += 1
        return sorted(taken)

    def other_edits(self, truth: str, top1: list[Edit], rng: random.Random) -> list[Edit]:
        """A hypothesis besides TOP1: its spans kept, undone or heard otherwise, and errors elsewhere."""
        out: list[Edit] = []
        for start, end, written in top1:
            roll = rng.random()
            if roll < 0.55:
                out.append((start, end, written))
            elif roll < 0.8 and end > start:
                alt = self.written_as("homophone" if rng.random() < 0.7 else "near", truth[start:end], rng)
                if alt is not None and alt != truth[start:end]:
                    out.append((start, end, alt))
        for _ in range(1 + (rng.random() < 0.35)):
            cls = rng.choices(("homophone", "near", "other", "dropped", "added", "filler"),
                              (0.5, 0.15, 0.15, 0.08, 0.07, 0.05))[0]
            edit = self._span(cls, truth, out, rng)
            if edit is not None:
                out.append(edit)
        return sorted(out)

    def nbest(self, words: list[str], rng: random.Random) -> tuple[list[str], list[Edit]]:
        """A 10-best list (spaced) for a truth given as words, and TOP1's edits."""
        cfg = self.config
        truth = "".join(words)
        ends = list(itertools.accumulate(map(len, words)))
        bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        top1 = self.top1_edits(truth, rng, bounds)
        hyps = [render(words, top1)]
        seen = {hyps[0].replace(" ", ""), truth}
        listed_at = rng.randint(2, cfg.n_best) if top1 and rng.random() < cfg.p_truth_listed else None
        stretches = Stretches.draw(truth, bounds, top1, rng) if cfg.focused else None
        for _ in range(60):
            if len(hyps) >= cfg.n_best - (listed_at is not None):
                break
            edits = stretches.edits(self.heard_otherwise, rng) if stretches else self.other_edits(truth, top1, rng)
            hyp = render(words, edits)
            if hyp.replace(" ", "") not in seen:
                seen.add(hyp.replace(" ", ""))
                hyps.append(hyp)
        if listed_at is not None:
            hyps.insert(min(listed_at - 1, len(hyps)), " ".join(words))
        return hyps, top1


def _occurrences(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _free(edit: Edit, taken: list[Edit], length: int) -> bool:
    """Tell whether an edit keeps at least one correct character from every taken one (so spans stay apart)."""
    start, end, _ = edit
    return all(end + 1 <= s or e + 1 <= start for s, e, _ in taken) and 0 <= start <= end <= length
