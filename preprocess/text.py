"""Text normalisation shared by the corpus builder, the corrector and the answers without the model (`api.answers`).

The judge's ground truths hold Chinese characters only (non-Chinese characters were removed by the
competition rules), so an answer keeps the Han characters of a hypothesis and drops spaces, `<htr>`
markers, Latin words, digits and punctuation. When that would leave nothing, the hypothesis with its
spaces removed is returned instead, so an answer is never empty when TOP1 had characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HTR = "<htr>"
# Fillers of Taiwan customer-service speech. The judge's truths keep them where they were said (喂 at the
# start of a call, 欸 / 呃 / 痾 while thinking), so a corrector must not delete one the recogniser heard.
SPOKEN_FILLERS = frozenset("欸痾呃喂嗯啊噢喔哦唉誒")
# Han characters: the CJK unified ideographs (extension A, the basic block, extensions B and later), the
# compatibility ideographs, and 〇 (U+3007, "zero" in 二〇二二, which Unicode counts as Han).
_HAN_RANGES = "\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_HAN = re.compile(f"[{_HAN_RANGES}]")
_NON_HAN = re.compile(f"[^{_HAN_RANGES}]+")


@dataclass(frozen=True)
class NBest:
    """One question: the ASR n-best (best first, words separated by spaces) and its phone strings."""

    sentences: tuple[str, ...]
    phonemes: tuple[str, ...] = field(default=())

    @property
    def top1(self) -> str:
        return self.sentences[0] if self.sentences else ""


def is_han(char: str) -> bool:
    """Tell whether a single character is a Chinese (Han) character."""
    return bool(_HAN.fullmatch(char))


def han_chars(text: str) -> str:
    """Keep only the Han characters of a hypothesis (drops spaces, <htr>, Latin, digits, punctuation).

    Most hypotheses are Han words between spaces: those go without the substitution (a regular expression's match
    per space), once a search finds nothing else left (issue 61)."""
    joined = "".join(text.replace(HTR, "").split())
    return joined if _NON_HAN.search(joined) is None else _NON_HAN.sub("", joined)


def has_han(text: str) -> bool:
    """Tell whether a text holds at least one Han character."""
    return _HAN.search(text) is not None


def strip_spaces(text: str) -> str:
    """Remove all whitespace, as the judge's TOP1 baseline does."""
    return "".join(text.split())


def top1_answer(sentences: tuple[str, ...] | list[str]) -> str:
    """Answer with the first hypothesis: its Han characters, or the whole of it when it has none."""
    if not sentences:
        return ""
    first = sentences[0]
    return han_chars(first) or strip_spaces(first)
