# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The trigram's segmentation in C: `LanguageModel._split`'s words, found without a Python object per substring.

`LanguageModel._split` finds a sentence's most probable words by dynamic programming over the words that end at each
position; each of those is looked up by its substring, a string sliced and hashed per candidate word (about 7 µs a
sentence when every lookup is cached, more than twice that on the new sentences a served batch brings: issue 61).
Here the same search walks, from each position leftwards, two reversed tries at once: the trigram's words
(simplified, with their unigram log10 probabilities) and the Taiwan lexicon's (traditional, with theirs). A step is
one lookup of (node, character) in an open-addressing table of C integers; a walk stops where neither trie goes on,
as `LanguageModel._window` stops at the first substring that ends no word.

The same words and the same floats as `LanguageModel._split` (its Python is the reference a test compares with, and
what runs where this module is not built: compiled.py): a word's entry is (the trigram's unigram if the simplified
substring is one of its words, else the Taiwan one plus the back-off, else the floor for a character alone; known to
the trigram; the Taiwan unigram or the floor); a split's value is the sum of its entries' first numbers, added left
to right; of equal values the longer last word wins.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_READ_CHAR
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memset

cdef class ReversedTrie:
    """Words read from their last character to their first: node 0 is the empty suffix; (node, character) -> the
    node of the suffix one character longer, in an open-addressing table; a node that is a whole word holds a value."""

    cdef uint64_t *keys  # (node << 21 | character) + 1; 0 is an empty slot
    cdef int32_t *nodes
    cdef uint64_t mask
    cdef int shift  # 64 - log2(capacity): a slot is the product's top bits (Fibonacci hashing)
    cdef double *values
    cdef char *is_word
    cdef int32_t size

    def __cinit__(self, dict words):
        cdef Py_ssize_t n_steps = sum(len(w) for w in words) + 1
        cdef uint64_t capacity = 2
        self.shift = 63
        while capacity < 2 * <uint64_t>n_steps:
            capacity <<= 1
            self.shift -= 1
        self.mask = capacity - 1
        self.keys = <uint64_t *>PyMem_Malloc(capacity * sizeof(uint64_t))
        self.nodes = <int32_t *>PyMem_Malloc(capacity * sizeof(int32_t))
        self.values = <double *>PyMem_Malloc(n_steps * sizeof(double))
        self.is_word = <char *>PyMem_Malloc(n_steps * sizeof(char))
        if not self.keys or not self.nodes or not self.values or not self.is_word:
            raise MemoryError()
        memset(self.keys, 0, capacity * sizeof(uint64_t))
        memset(self.is_word, 0, n_steps * sizeof(char))
        self.size = 1
        cdef int32_t node
        cdef Py_ssize_t k
        for word, value in words.items():
            node = 0
            for k in range(len(word) - 1, -1, -1):
                node = self._child(node, ord(word[k]), True)
            self.values[node] = value
            self.is_word[node] = 1

    def __dealloc__(self):
        PyMem_Free(self.keys)
        PyMem_Free(self.nodes)
        PyMem_Free(self.values)
        PyMem_Free(self.is_word)

    cdef inline int32_t _child(self, int32_t node, Py_UCS4 char, bint add):
        """The node one character longer than `node`, -1 where there is none (a new one where `add`)."""
        cdef uint64_t key = ((<uint64_t>node << 21) | <uint64_t>char) + 1
        cdef uint64_t slot = (key * <uint64_t>0x9E3779B97F4A7C15) >> self.shift
        while self.keys[slot] != 0:
            if self.keys[slot] == key:
                return self.nodes[slot]
            slot = (slot + 1) & self.mask
        if not add:
            return -1
        self.keys[slot] = key
        self.nodes[slot] = self.size
        self.size += 1
        return self.size - 1


cdef class Segmenter:
    """`split(trad, simple)`: `LanguageModel._split`'s result, for the trigram's words (simplified -> log10 unigram)
    and the Taiwan lexicon's (traditional -> log10 unigram), words of at most `max_word` characters."""

    cdef ReversedTrie trigram
    cdef ReversedTrie taiwan
    cdef double floor
    cdef double oov_backoff
    cdef Py_ssize_t max_word

    def __init__(self, dict trigram, dict taiwan, double floor, double oov_backoff, Py_ssize_t max_word):
        self.trigram = ReversedTrie(trigram)
        self.taiwan = ReversedTrie(taiwan)
        self.floor = floor
        self.oov_backoff = oov_backoff
        self.max_word = max_word

    def split(self, str trad, str simple):
        """The most probable words of a sentence (`simple`: its simplified text, as long), as (start, end, (log10
        unigram, in the trigram, Taiwan log10 unigram)), in order."""
        cdef Py_ssize_t n = len(trad)
        if len(simple) != n:
            raise ValueError("the simplified text must be as long as the traditional one")
        cdef double *best = <double *>PyMem_Malloc((n + 1) * 3 * sizeof(double))
        cdef int64_t *starts = <int64_t *>PyMem_Malloc((n + 1) * sizeof(int64_t))
        cdef char *known = <char *>PyMem_Malloc((n + 1) * sizeof(char))
        if not best or not starts or not known:
            PyMem_Free(best)
            PyMem_Free(starts)
            PyMem_Free(known)
            raise MemoryError()
        cdef double *unigram = best + (n + 1)
        cdef double *local = best + 2 * (n + 1)
        cdef Py_ssize_t i, j, d
        cdef int32_t at_trigram, at_taiwan
        cdef double value, top, u, tw
        cdef bint in_trigram, in_taiwan
        try:
            best[0] = 0.0
            for j in range(1, n + 1):
                at_trigram = at_taiwan = 0
                top = -INFINITY
                starts[j] = 0
                for d in range(1, min(self.max_word, j) + 1):  # the character alone first, then longer words
                    i = j - d
                    if at_trigram >= 0:
                        at_trigram = self.trigram._child(at_trigram, PyUnicode_READ_CHAR(simple, i), False)
                    if at_taiwan >= 0:
                        at_taiwan = self.taiwan._child(at_taiwan, PyUnicode_READ_CHAR(trad, i), False)
                    if at_trigram < 0 and at_taiwan < 0 and d > 1:
                        break
                    in_trigram = at_trigram >= 0 and self.trigram.is_word[at_trigram]
                    in_taiwan = at_taiwan >= 0 and self.taiwan.is_word[at_taiwan]
                    if in_trigram:
                        u = self.trigram.values[at_trigram]
                        tw = self.taiwan.values[at_taiwan] if in_taiwan else self.floor
                    elif in_taiwan:
                        tw = self.taiwan.values[at_taiwan]
                        u = tw + self.oov_backoff
                    elif d == 1:
                        u = tw = self.floor
                    else:
                        continue
                    value = best[i] + u
                    if value >= top:  # shorter words came first: of equal values the longer one wins
                        top = value
                        starts[j] = i
                        unigram[j] = u
                        local[j] = tw
                        known[j] = in_trigram
                best[j] = top
            out = []
            j = n
            while j > 0:
                i = starts[j]
                out.append((i, j, (unigram[j], bool(known[j]), local[j])))
                j = i
            out.reverse()
            return out
        finally:
            PyMem_Free(best)
            PyMem_Free(starts)
            PyMem_Free(known)
