"""Pronunciations: characters to syllables (pypinyin), syllables to the judge's phone notation.

A syllable is kept as (initial, final, tone) in pypinyin's strict form: the zero initial is "", the final
is the full one ("iou", "uei", "uen", "v" for ü) and the tone is 1-5 (5 = neutral). The phone notation is
described in docs/contract.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pypinyin import Style, pinyin

INITIAL_PHONES = {
    "b": "p", "p": "p_h", "m": "m", "f": "f", "d": "t", "t": "t_h", "n": "n", "l": "l",
    "g": "k", "k": "k_h", "h": "x", "j": "ts6", "q": "ts6_h", "x": "s6",
    "zh": "ttss", "ch": "ttss_h", "sh": "ss", "r": "zz", "z": "ts", "c": "ts_h", "s": "s",
}  # fmt: skip
FINAL_PHONES = {
    "a": "A:", "o": "O:", "e": "ax", "ai": "aI", "ei": "eI", "ao": "aU", "ou": "oU", "er": "axr",
    "i": "i:", "u": "u:", "v": "y", "an": "A: n", "ang": "A: N", "en": "ax n", "eng": "ax N",
    "ong": "w ax N", "ia": "j A:", "ian": "j A: n", "iang": "j A: N", "ie": "j E", "iao": "j aU",
    "in": "j ax n", "ing": "j ax N", "iou": "j oU", "iong": "H ax N", "ua": "w A:", "uo": "w O:",
    "uai": "w aI", "uei": "w eI", "uan": "w A: n", "uang": "w A: N", "uen": "w ax n", "ueng": "w ax N",
    "ve": "H E", "van": "H A: n", "vn": "H ax n", "io": "j O:", "ê": "E",
}  # fmt: skip
APICAL_INITIALS = frozenset({"zh", "ch", "sh", "r", "z", "c", "s"})


@dataclass(frozen=True)
class Syllable:
    initial: str
    final: str
    tone: int

    @property
    def toneless(self) -> str:
        return self.initial + self.final


@lru_cache(maxsize=65536)
def char_syllable(char: str) -> Syllable | None:
    """Return the most common reading of one Han character, or None when pypinyin has none."""
    initials = pinyin(char, style=Style.INITIALS, strict=True, errors="ignore")
    finals = pinyin(char, style=Style.FINALS_TONE3, strict=True, neutral_tone_with_five=True, errors="ignore")
    if not initials or not finals or not finals[0][0]:
        return None
    final = finals[0][0]
    tone = int(final[-1]) if final[-1].isdigit() else 5
    final = final.rstrip("12345")
    if not final or final not in FINAL_PHONES:
        return None
    return Syllable(initials[0][0], final, tone)


def syllable_phones(syl: Syllable) -> str:
    """Spell one syllable in the judge's phone notation, tone glued to its last phone."""
    parts: list[str] = []
    if syl.initial:
        parts.append(INITIAL_PHONES[syl.initial])
    if not (syl.final == "i" and syl.initial in APICAL_INITIALS):
        parts.extend(FINAL_PHONES[syl.final].split())
    parts[-1] += str(syl.tone)
    return " ".join(parts)


def text_phones(text: str) -> str:
    """Spell a hypothesis in phones: Han characters by their reading, <htr> as spn, others skipped."""
    out: list[str] = []
    for token in text.split():
        if token == "<htr>":
            out.append("spn")
            continue
        for char in token:
            syl = char_syllable(char)
            if syl is not None:
                out.append(syllable_phones(syl))
    return " ".join(out)
