# distutils: language = c++
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

`Segmenter.score_fields` goes on to the sentence's score, `LanguageModel._score_fields`' (its reference): each word
the trigram knows is scored by KenLM from the index its trie node holds (found once, at set-up), through the model
the `kenlm` module loaded, with no Python call, string or state object per word (the Python path's KenLM calls were
about 4 ms of a batch's 11 in the second stage). The same floats, added in the same order.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_READ_CHAR
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset

# KenLM's virtual interface (`lm/virtual_interface.hh`), as far as this kernel calls it: a model's state size, its
# begin-of-sentence and null-context states, its vocabulary's index of a word and `BaseScore`, in the order of their
# virtual tables and members. The model is the one `kenlm.Model` (PyPI's `ufal-kenlm`, pinned in requirements.txt)
# loaded through that interface; its object holds the `lm::base::Model *` first. `Segmenter` checks the two agree on
# a sample before it scores with it (`_agrees`), and the tests hold every score to the Python path's.
cdef extern from *:
    """
    #include <cstddef>
    namespace esun_kenlm {
    struct Piece { const char *data; size_t length; };
    class Vocabulary {
      public:
        virtual ~Vocabulary() {}
        virtual unsigned int Index(const Piece &word) const = 0;
    };
    class Model {
      public:
        virtual ~Model() {}
        virtual float BaseScore(const void *in_state, unsigned int word, void *out_state) const = 0;
        size_t state_size;
        const void *begin_sentence, *null_context;
        const Vocabulary *vocabulary;
    };
    struct PyModel { PyObject_HEAD Model *model; };
    static Model *model_of(PyObject *wrapper) { return reinterpret_cast<PyModel *>(wrapper)->model; }
    static unsigned int index_of(const Model *model, const char *data, size_t length) {
        Piece word = {data, length};
        return model->vocabulary->Index(word);
    }
    }
    """
    cppclass KenLM "esun_kenlm::Model":
        float BaseScore(const void *in_state, unsigned int word, void *out_state)
        size_t state_size
        const void *begin_sentence
        const void *null_context
    KenLM *model_of "esun_kenlm::model_of"(PyObject *wrapper)
    unsigned int index_of "esun_kenlm::index_of"(const KenLM *model, const char *data, size_t length)

cdef enum:
    MAX_STATE = 256  # bytes: a trigram's state is 44


# A sentence being scored: KenLM's state before the next word and the one it writes, and the sum so far.
cdef struct Scoring:
    char first[MAX_STATE]
    char second[MAX_STATE]
    void *state
    void *out
    double total

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
        for word, value in words.items():
            node = self._node(word, True)
            self.values[node] = value
            self.is_word[node] = 1

    def __dealloc__(self):
        PyMem_Free(self.keys)
        PyMem_Free(self.nodes)
        PyMem_Free(self.values)
        PyMem_Free(self.is_word)

    cdef int32_t _node(self, str word, bint add):
        """The node of a whole word, -1 where it is none (added where `add`)."""
        cdef int32_t node = 0
        cdef Py_ssize_t k
        for k in range(len(word) - 1, -1, -1):
            node = self._child(node, PyUnicode_READ_CHAR(word, k), add)
            if node < 0:
                break
        return node

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
    and the Taiwan lexicon's (traditional -> log10 unigram), words of at most `max_word` characters.

    `score_fields(trad, simple)`: `LanguageModel._score_fields`' result from that split, the trigram's words scored
    by KenLM's index (each word's found once, here), where a `kenlm.Model` of those words is given and agrees with
    this kernel's calls on a sample (`scores`); else None."""

    cdef ReversedTrie trigram
    cdef ReversedTrie taiwan
    cdef double floor
    cdef double oov_backoff
    cdef Py_ssize_t max_word
    cdef object wrapper  # the kenlm.Model whose model `lm` is: kept alive with this
    cdef KenLM *lm
    cdef unsigned int *word_index  # the trigram trie's node -> the word's KenLM index
    cdef unsigned int end_index
    cdef readonly bint scores

    def __init__(self, dict trigram, dict taiwan, double floor, double oov_backoff, Py_ssize_t max_word,
                 model=None):
        self.trigram = ReversedTrie(trigram)
        self.taiwan = ReversedTrie(taiwan)
        self.floor = floor
        self.oov_backoff = oov_backoff
        self.max_word = max_word
        self.scores = False
        if model is not None:
            self._index(trigram, model)
            self.scores = self._agrees(model, list(trigram))

    def __dealloc__(self):
        PyMem_Free(self.word_index)

    cdef _index(self, dict trigram, model):
        cdef int32_t node
        self.wrapper = model
        self.lm = model_of(<PyObject *>model)
        if self.lm.state_size > MAX_STATE:
            self.lm = NULL
            return
        self.word_index = <unsigned int *>PyMem_Malloc(self.trigram.size * sizeof(unsigned int))
        if not self.word_index:
            raise MemoryError()
        for word in trigram:
            node = self.trigram._node(word, False)
            encoded = word.encode("utf-8")
            self.word_index[node] = index_of(self.lm, encoded, len(encoded))
        self.end_index = index_of(self.lm, b"</s>", 4)

    def _agrees(self, model, list words):
        """Whether this kernel's KenLM calls give the `kenlm` module's scores on sentences of the trigram's words."""
        import kenlm

        if self.lm == NULL or not words:
            return False
        step = max(1, len(words) // 997)
        sample = words[::step]
        for start in range(0, min(len(sample), 600), 6):
            sentence = sample[start : start + 6]
            state, out = kenlm.State(), kenlm.State()
            model.BeginSentenceWrite(state)
            expected = 0.0
            for word in sentence:
                expected += model.BaseScore(state, word, out)
                state, out = out, state
            expected += model.BaseScore(state, "</s>", out)
            if self._known_words_score(sentence) != expected:
                return False
        return True

    cdef inline void _begin(self, Scoring *s):
        s.state = s.first
        s.out = s.second
        s.total = 0.0
        memcpy(s.state, self.lm.begin_sentence, self.lm.state_size)

    cdef inline void _add(self, Scoring *s, unsigned int index):
        """The next word's log10 probability added (a C float, as the `kenlm` module returns it), its state kept."""
        cdef void *swap
        s.total += self.lm.BaseScore(s.state, index, s.out)
        swap = s.state
        s.state = s.out
        s.out = swap

    cdef double _known_words_score(self, list sentence):
        cdef Scoring s
        self._begin(&s)
        for word in sentence:
            self._add(&s, self.word_index[self.trigram._node(word, False)])
        self._add(&s, self.end_index)
        return s.total

    cdef Py_ssize_t _search(self, str trad, str simple, Py_ssize_t n, double *best, int64_t *starts, char *known,
                            double *unigram, double *local, int32_t *node_of) except -1:
        """The dynamic programme: for each end j, the best split's last word (its start, entry and trigram node)."""
        cdef Py_ssize_t i, j, d
        cdef int32_t at_trigram, at_taiwan
        cdef double value, top, u, tw
        cdef bint in_trigram, in_taiwan
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
                    node_of[j] = at_trigram
            best[j] = top
        return 0

    def split(self, str trad, str simple):
        """The most probable words of a sentence (`simple`: its simplified text, as long), as (start, end, (log10
        unigram, in the trigram, Taiwan log10 unigram)), in order."""
        return self._words(trad, simple, False)

    def score_fields(self, str trad, str simple):
        """`LanguageModel._score_fields(trad)` (`simple`: its simplified text, as long): (log10 probability of the
        sentence, its words, how many the trigram lacks, the Taiwan log10 unigrams' sum), added in the same order."""
        if not self.scores:
            raise ValueError("this segmenter was given no KenLM model that agrees with it")
        return self._words(trad, simple, True)

    cdef _words(self, str trad, str simple, bint score):
        cdef Py_ssize_t n = len(trad)
        if len(simple) != n:
            raise ValueError("the simplified text must be as long as the traditional one")
        cdef double *best = <double *>PyMem_Malloc((n + 1) * 3 * sizeof(double))
        cdef int64_t *starts = <int64_t *>PyMem_Malloc((n + 1) * 2 * sizeof(int64_t))
        cdef char *known = <char *>PyMem_Malloc((n + 1) * sizeof(char))
        cdef int32_t *node_of = <int32_t *>PyMem_Malloc((n + 1) * sizeof(int32_t))
        if not best or not starts or not known or not node_of:
            PyMem_Free(best)
            PyMem_Free(starts)
            PyMem_Free(known)
            PyMem_Free(node_of)
            raise MemoryError()
        cdef double *unigram = best + (n + 1)
        cdef double *local = best + 2 * (n + 1)
        cdef int64_t *ends = starts + (n + 1)  # the split's word ends, last first
        cdef Py_ssize_t i, j, m, w
        cdef Scoring s
        cdef double taiwan = 0.0
        cdef Py_ssize_t oov = 0
        try:
            self._search(trad, simple, n, best, starts, known, unigram, local, node_of)
            m = 0
            j = n
            while j > 0:
                ends[m] = j
                m += 1
                j = starts[j]
            if not score:
                return [(starts[ends[w]], ends[w], (unigram[ends[w]], bool(known[ends[w]]), local[ends[w]]))
                        for w in range(m - 1, -1, -1)]
            self._begin(&s)
            words = []
            for w in range(m - 1, -1, -1):
                j = ends[w]
                i = starts[j]
                taiwan += local[j]
                if known[j]:
                    self._add(&s, self.word_index[node_of[j]])
                else:  # the trigram lacks it: the Taiwan prior (or floor) instead of <unk>, and the context restarts
                    s.total += unigram[j]
                    oov += 1
                    memcpy(s.state, self.lm.null_context, self.lm.state_size)
                words.append(trad[i:j])
            self._add(&s, self.end_index)
            return s.total, tuple(words), oov, taiwan
        finally:
            PyMem_Free(best)
            PyMem_Free(starts)
            PyMem_Free(known)
            PyMem_Free(node_of)
