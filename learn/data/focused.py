"""Lower hypotheses shaped as a real recogniser's (issue 60): each one TOP1 with one stretch (now and then two) of a
list's few uncertain stretches written otherwise.

Real ten-hypothesis lists: a lower hypothesis differs from TOP1 at 15-18 % of its positions, in about one span, at
most two, and most are sound-alike variants of the same one or two stretches (the lattice's uncertain words), so the
positions where any of them differs are few (about a third of TOP1's). The calibrated stand-in's lower hypotheses
(`RealRecogniser.other_edits`) each add one or two errors of their own anywhere, and together differ from TOP1 at
about 80 % of its positions: a shape no real list has, which the gate and the network learned from.

A list's uncertain stretches (`Stretches`): TOP1's error spans, and, so that a list has one to three of them, truth
words of one to three characters that TOP1 writes right (the recogniser was unsure there too). A lower hypothesis
(`Stretches.edits`) writes one stretch otherwise (two in `P_TWO` of them): a TOP1 error span heard another way (a
homophone or near writing of what was said), now and then undone where TOP1 has several; a right stretch as a
sound-alike writing. Everything else is TOP1's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from learn.data.real_profile import Edit
from preprocess.text import SPOKEN_FILLERS

P_TWO = 0.1  # a lower hypothesis that varies two stretches
P_UNDO = 0.25  # a varied TOP1 error span written as said (only a partial fix: the truth is placed apart)
STRETCHES = {1: (0.45, 0.45, 0.10), 0: (0.0, 0.6, 0.4)}  # wrong TOP1 / right TOP1: weights of 1, 2, 3 stretches

Writer = Callable[[str, str, int, int, random.Random], "str | None"]  # (class, truth, start, end, rng) -> a writing


@dataclass(frozen=True)
class Stretches:
    """A list's uncertain stretches of the truth: TOP1's error spans and right words the recogniser doubted."""

    truth: str
    top1: tuple[Edit, ...]
    right: tuple[tuple[int, int], ...]

    @classmethod
    def draw(cls, truth: str, bounds: list[tuple[int, int]], top1: list[Edit], rng: random.Random) -> Stretches:
        """Add to TOP1's spans right words (1-3 characters, no filler, apart from every span) up to a drawn count."""
        weights = STRETCHES[1 if top1 else 0]
        want = rng.choices((1, 2, 3), weights)[0]
        free = [(i, j) for i, j in bounds if 1 <= j - i <= 3 and not set(truth[i:j]) & SPOKEN_FILLERS
                and all(j < s or i > e for s, e, _ in top1)]
        rng.shuffle(free)
        right: list[tuple[int, int]] = []
        for i, j in free:
            if len(top1) + len(right) >= want:
                break
            if all(j < s or i > e for s, e in right):
                right.append((i, j))
        return cls(truth, tuple(top1), tuple(sorted(right)))

    def edits(self, write: Writer, rng: random.Random) -> list[Edit]:
        """One lower hypothesis: TOP1's spans, with one stretch (or two) written otherwise."""
        places: list[Edit | tuple[int, int]] = [*self.top1, *self.right]
        chosen = rng.sample(range(len(places)), min(len(places), 2 if rng.random() < P_TWO else 1))
        out: list[Edit] = []
        for k, place in enumerate(places):
            if k not in chosen:
                if len(place) == 3:
                    out.append(place)  # type: ignore[arg-type]
                continue
            start, end = place[0], place[1]
            said = self.truth[start:end]
            if len(place) == 3 and len(self.top1) > 1 and rng.random() < P_UNDO:
                continue  # this span as said
            now = place[2] if len(place) == 3 else said  # type: ignore[misc]
            written = self._otherwise(start, end, now, write, rng)
            if written is not None:
                out.append((start, end, written))
            elif len(place) == 3:
                out.append(place)  # type: ignore[arg-type]
        return sorted(out)

    def _otherwise(self, start: int, end: int, now: str, write: Writer, rng: random.Random) -> str | None:
        """A sound-alike writing of truth[start:end] that is neither what was said nor what TOP1 writes (or None)."""
        said = self.truth[start:end]
        if not said:  # a word TOP1 added: another word of its length stands in its place
            return None
        for _ in range(4):
            got = write("homophone" if rng.random() < 0.7 else "near", self.truth, start, end, rng)
            if got is not None and got not in (said, now):
                return got
        return None
