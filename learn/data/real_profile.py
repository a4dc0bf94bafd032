"""The calibrated stand-in recogniser's profile: its knobs (`RealConfig`, and the hard profile `HARD`), the real data's
span mix and lengths it aims at, the named rewrites that head its inventory of systematic confusions (`Rewrite`),
the edit a span makes (`Edit`) and the truth's words written with its edits (`render`). The recogniser itself:
`learn.data.real_recogniser`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from learn.error_stats import REAL

# the real span mix (REAL.span_share) is what the recogniser aims at
SPAN_MIX = REAL.span_share
# span length (max of the two sides) per class: {length: weight}
SPAN_LENGTHS: dict[str, dict[int, float]] = {
    "homophone": {1: 0.64, 2: 0.3, 3: 0.06},
    "near": {1: 0.5, 2: 0.38, 3: 0.12},
    "other": {1: 0.47, 2: 0.38, 3: 0.1, 4: 0.05},
    "added": {1: 0.45, 2: 0.38, 3: 0.13, 4: 0.04},
    "dropped": {1: 0.5, 2: 0.38, 3: 0.12},
    "other_length": {2: 0.62, 3: 0.32, 4: 0.06},
}
# (said, written) fillers and variant forms the recogniser writes; the head of its systematic rewrites
NAMED_REWRITES = (
    ("呃", "痾"), ("在", "再"), ("嗯", "呃"), ("的", "得"), ("呃", ""), ("有", "又"), ("券", "卷"), ("已", "以"),
    ("欸", ""), ("再", "在"), ("周", "週"), ("地", "的"), ("以", "已"), ("嗯", ""), ("得", "的"), ("布", "佈"),
    ("又", "有"), ("帳", "賬"), ("呃", "嗯"), ("臺", "台"), ("的", "地"), ("注", "註"),
)
# said -> written: forms both Taiwan writings use (equal once simplified)
VARIANT_FORMS = {"周": "週", "布": "佈", "臺": "台", "注": "註", "制": "製", "準": "准", "佔": "占", "占": "佔",
                 "匯": "彙", "裡": "裏", "汙": "污", "溼": "濕"}
FILLER_SWAPS = {"呃": ("痾", "嗯"), "嗯": ("呃",), "欸": ("呃", "誒"), "痾": ("呃",)}  # said -> written


@dataclass(frozen=True)
class RealConfig:
    """Knobs of the calibrated recogniser (set from REAL's figures, see the module docstring)."""

    utterance_chars: float = 14.5  # mean drawn length of a cut (a clause's short remainder makes the mean 10.8)
    p_start_filler: float = 0.15
    p_wrong: float = 1 - REAL.top1_right
    spans_when_wrong: tuple[float, ...] = (0.69, 0.20, 0.07, 0.028, 0.012)  # 1, 2, ... spans
    p_systematic: float = 0.35
    inventory: int = 600  # systematic rewrites
    zipf: float = 0.4
    n_best: int = 10
    p_truth_listed: float = 0.75
    # issue 39: real errors are mostly plausible text (the trigram prefers the wrong TOP1 4 times in 10). A one-off
    # homophone, near or other span is, with this probability, a whole truth word heard as another corpus word of
    # the same length (sounding the same, near, or not): of every such word at every place, drawn by how much more
    # the recogniser's language model likes the sentence with it than what was said, as a decoder's errors are: a
    # fluent error. The real recogniser's LM is unknown; what is known is how often the shipped trigram agrees with
    # it, so the stand-in's recogniser scores with the shipped trigram (`learn.data.standin_real.build_real`)
    p_fluent: float = 0.0
    # and, with this probability, a one-off homophone, near or other span is the writing its own language model (a
    # character bigram of corpus text, not the corrector's) likes best in context, as a decoder's errors are
    p_decoded: float = 0.0
    decoded_choices: int = 6  # writings it weighs at each place
    # and a sound-alike character is one commoner than what was said, drawn by its corpus count (else by rank, the
    # rarer ones often): real rules' written sides are common text, right in most of the places a TOP1 writes them
    # (rates 0.03 / 0.13 / 0.50), as a decoder's LM pulls towards the commoner writing
    common_writing: bool = False
    # issue 60: the lower hypotheses vary one or two of the list's few uncertain stretches, as a real recogniser's do
    # (`learn.data.focused`), instead of each adding errors of its own anywhere
    focused: bool = False


# the hard profile (issue 39): every one-off homophone, near or other span a decoder's error
HARD = RealConfig(p_fluent=1.0, p_decoded=1.0, p_systematic=0.2, common_writing=True,
                spans_when_wrong=(0.66, 0.22, 0.08, 0.028, 0.012))
# issue 60: the same two recognisers with lower hypotheses shaped as a real recogniser's
PROFILES = {"real": RealConfig(), "hard": HARD, "real-shaped": RealConfig(focused=True),
            "hard-shaped": replace(HARD, focused=True)}


@dataclass(frozen=True)
class Rewrite:
    """One systematic confusion: the recogniser writes `written` where `said` was said ("": added / dropped)."""

    said: str
    written: str
    cls: str
    weight: float  # its Zipf weight over the share of truths its spoken side occurs in


Edit = tuple[int, int, str]  # truth[start:end] is written as the text ("" drops it; start == end adds it)


def render(words: list[str], edits: list[Edit]) -> str:
    """The truth's words with edits applied, spaced as the words (an added word its own, a rewrite in its word)."""
    starts = set(itertools.accumulate(len(w) for w in words[:-1]))
    text = "".join(words)
    at = {s: (e, w) for s, e, w in edits if e > s}
    added = {s: w for s, e, w in edits if e == s}
    tokens: list[str] = []
    cur = ""
    i = 0
    while i <= len(text):
        if i in starts or i == len(text) or i in added:
            if cur:
                tokens.append(cur)
            cur = ""
        if i in added:
            tokens.append(added[i])
        if i == len(text):
            break
        if i in at:
            end, written = at[i]
            cur += written
            i = end
            continue
        cur += text[i]
        i += 1
    return " ".join(t for t in tokens if t)
