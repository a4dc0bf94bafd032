"""Align every hypothesis of an n-best list to TOP1, character by character.

Each TOP1 position gets the segment of another hypothesis aligned to it: one character (kept or
substituted), "" (deleted) or several characters (an insertion rides on the position before it; one
before the first character rides on the first). Alignment is on Han characters only, so hypotheses that
differ only in word segmentation align as equal.
"""

from __future__ import annotations

import cython
from rapidfuzz.distance import Levenshtein


# typed for the C compiler (compiled.py): the opcodes' indices become C integers, the segments a list indexed directly
@cython.locals(i1=cython.Py_ssize_t, i2=cython.Py_ssize_t, j1=cython.Py_ssize_t, j2=cython.Py_ssize_t,
               n=cython.Py_ssize_t, k=cython.Py_ssize_t, segs=list, prefix=str)
def align_to(top1: str, hyp: str, chars: list[str] | None = None) -> list[str]:
    """Return, for each character of `top1`, the segment of `hyp` aligned to it (`chars`: `list(top1)`, when the
    caller has it)."""
    if not top1:
        return []
    # where the two are equal (most positions), TOP1's own characters: no new string per position (issue 61)
    segs = list(top1) if chars is None else chars.copy()
    prefix = ""
    for tag, i1, i2, j1, j2 in Levenshtein.opcodes(top1, hyp):
        if tag == "equal":
            continue
        if tag == "insert":
            if i1 == 0:
                prefix += hyp[j1:j2]
            else:
                segs[i1 - 1] += hyp[j1:j2]
        elif tag == "delete":
            for k in range(i1, i2):
                segs[k] = ""
        else:  # replace: pair in order, surplus characters ride on the last position
            n = i2 - i1
            for k in range(n):
                segs[i1 + k] = hyp[j1 + k] if j1 + k < j2 else ""
            if j2 - j1 > n:
                segs[i2 - 1] += hyp[j1 + n : j2]
    if prefix:
        segs[0] = prefix + segs[0]
    return segs


def align_nbest(top1: str, hyps: list[str]) -> list[list[str]]:
    """Align each hypothesis to TOP1: a matrix of segments, one row per hypothesis."""
    chars = list(top1)
    return [align_to(top1, h, chars) for h in hyps]
