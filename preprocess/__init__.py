"""Turning the judge's n-best lists into text and alignments the model reads: normalising, aligning, phones,
confusions, rules."""

from compiled import extend

extend(__name__, __path__)  # the compiled hot modules, where built and current (compiled.py)
