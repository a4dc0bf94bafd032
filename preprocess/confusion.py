"""Which characters a Mandarin recogniser confuses: same syllable, other tone, near syllable.

Near syllables follow the confusions typical of Taiwan Mandarin speech: retroflex and dental initials
(zh/z, ch/c, sh/s), n/l, f/h, r/l, and the nasal codas -n/-ng.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from preprocess.phones import Syllable, char_syllable

INITIAL_SWAPS = {
    "zh": ("z",), "z": ("zh",), "ch": ("c",), "c": ("ch",), "sh": ("s",), "s": ("sh",),
    "n": ("l",), "l": ("n", "r"), "f": ("h",), "h": ("f",), "r": ("l",),
}  # fmt: skip
FINAL_SWAPS = {
    "an": ("ang",), "ang": ("an",), "en": ("eng",), "eng": ("en",), "in": ("ing",), "ing": ("in",),
    "ian": ("iang",), "iang": ("ian",), "uan": ("uang",), "uang": ("uan",), "uen": ("ueng", "ong"),
}  # fmt: skip

SAME_TONE, OTHER_TONE, NEAR = 0, 1, 2

# Orthographic variants of one character. OpenCC's s2twp writes the Ministry of Education's standard forms
# (臺, 汙, 溼), while Taiwan's everyday text and the recogniser's lexicon mostly use the common ones (台, 污,
# 濕): swapping one for the other never fixes a recognition error, so a correction never does it.
_VARIANT_PAIRS = ("台臺", "污汙", "濕溼", "裡裏", "著着", "為爲", "群羣", "峰峯", "線綫", "啟啓", "眾衆", "衛衞")
VARIANTS: dict[str, str] = {a: b for a, b in _VARIANT_PAIRS} | {b: a for a, b in _VARIANT_PAIRS}


def near_toneless(syl: Syllable) -> list[str]:
    """List the toneless syllables one initial or final swap away from this one."""
    out = [init + syl.final for init in INITIAL_SWAPS.get(syl.initial, ())]
    out += [syl.initial + fin for fin in FINAL_SWAPS.get(syl.final, ())]
    return out


class ConfusionSet:
    """Characters that sound like a given one, most frequent first, from a character frequency table."""

    def __init__(self, char_counts: Mapping[str, int]) -> None:
        self._counts = dict(char_counts)
        self._by_toneless: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for char, _count in sorted(self._counts.items(), key=lambda kv: -kv[1]):
            syl = char_syllable(char)
            if syl is not None:
                self._by_toneless[syl.toneless].append((char, syl.tone))
        self._cache: dict[tuple[str, int], list[tuple[str, int]]] = {}

    def similar(self, char: str, limit: int = 8) -> list[tuple[str, int]]:
        """Return up to `limit` (character, relation) pairs sounding like `char`, closest relation first."""
        key = (char, limit)
        if key in self._cache:
            return self._cache[key]
        syl = char_syllable(char)
        out: list[tuple[str, int]] = []
        if syl is not None:
            same = [(c, SAME_TONE if t == syl.tone else OTHER_TONE) for c, t in self._by_toneless[syl.toneless]]
            same = [p for p in same if p[0] != char]
            same.sort(key=lambda p: p[1])  # stable: same tone first, each by frequency
            near = [(c, NEAR) for tl in near_toneless(syl) for c, t in self._by_toneless.get(tl, ()) if t == syl.tone]
            near.sort(key=lambda p: -self._counts.get(p[0], 0))
            out = (same[: max(1, limit * 2 // 3)] + near)[:limit]
            if len(out) < limit:
                out += [p for p in same if p not in out][: limit - len(out)]
        self._cache[key] = out
        return out

    def same_syllable(self, char: str) -> list[str]:
        """Return every known character with the same toneless syllable, most frequent first."""
        syl = char_syllable(char)
        return [] if syl is None else [c for c, _ in self._by_toneless[syl.toneless] if c != char]

    def near_syllable(self, char: str) -> list[str]:
        """Return every known character one near-syllable swap away, most frequent first."""
        syl = char_syllable(char)
        if syl is None:
            return []
        return [c for tl in near_toneless(syl) for c, _ in self._by_toneless.get(tl, ())]

    def count(self, char: str) -> int:
        return self._counts.get(char, 0)
