"""Turn n-best lists into the corrector's inputs: TOP1 positions, each with a small candidate set.

Per TOP1 position the candidates are: keep (index 0); the distinct segments the other hypotheses align there
(substitutions, deletions as "", insertions as two characters), by best rank; then characters of the same or a near
syllable. The network picks one candidate per position, so it can only insert or delete where the n-best offers it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import cython
import numpy as np

from model.bigram import BigramLM, lm_delta
from model.contract import (
    ALTERNATIVES_SCALE,
    CANDIDATE_FEATURES,
    EDGE_COUNT_SCALE,
    HYPOTHESES_SCALE,
    LOG_FREQ_SCALE,
    POSITION_FEATURES,
    FeatureContractError,
)
from model.memo import Memo
from model.unanimous import Pending, UnanimousRows
from preprocess.align import align_nbest, align_to
from preprocess.confusion import NEAR, OTHER_TONE, SAME_TONE, VARIANTS, ConfusionSet
from preprocess.phones import char_syllable
from preprocess.text import NBest, han_chars

PAD, UNK, EMPTY = 0, 1, 2
MAX_LEN = 64
MAX_CANDIDATES = 10
MAX_FROM_NBEST = 6
MAX_SEGMENT = 2
N_POS_FEATS = len(POSITION_FEATURES)
N_CAND_FEATS = len(CANDIDATE_FEATURES)
BOS, EOS = "^", "$"
MIN_BIGRAM_COUNT = 2
BOUNDARY = {"B": 1, "M": 2, "E": 3, "S": 4}
_BEGIN, _MIDDLE, _END, _SINGLE = BOUNDARY["B"], BOUNDARY["M"], BOUNDARY["E"], BOUNDARY["S"]
# Segments (one or two characters, or none) whose ids and log frequency are memoised at once; characters whose
# syllable, and whose sound-alikes, are.
MAX_MEMO_SEGMENTS = 100_000
MAX_MEMO_CHARS = 100_000
# The columns in the order Featurizer._candidate_rows and _featurize write them (plain tuples, for speed: a NamedTuple's
# constructor is a Python call): the contract's.
_CANDIDATE_ROW = ("keep", "vote_share", "best_rank_inverse", "deletion", "insertion", "same_tone", "other_tone",
                  "near_syllable", "not_offered", "log_freq", "offered_by_second", "lm_delta", "left_edge_count",
                  "right_edge_count")
_POSITION_ROW = ("agreement", "alternatives", "hypotheses", "unknown_char", "position")
if _CANDIDATE_ROW != CANDIDATE_FEATURES:
    raise FeatureContractError(f"model/features.py writes candidate columns {_CANDIDATE_ROW}, the contract names "
                               f"{CANDIDATE_FEATURES}: update Featurizer._candidate_rows with the contract")
if _POSITION_ROW != POSITION_FEATURES:
    raise FeatureContractError(f"model/features.py writes position columns {_POSITION_ROW}, the contract names "
                               f"{POSITION_FEATURES}: update Featurizer._featurize with the contract")


@dataclass
class Vocab:
    """Characters and syllables known to the network, with character and character-bigram counts of the
    training text (the bigrams give each candidate a language-model score in its TOP1 context: `bigram_lm`)."""

    chars: list[str]
    counts: dict[str, int]
    syllables: list[str]
    bigrams: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.char_id = {c: i for i, c in enumerate(self.chars)}
        self.syl_id = {s: i for i, s in enumerate(self.syllables)}
        total = sum(self.counts.values()) or 1
        self.log_freq = {c: math.log(n / total) for c, n in self.counts.items()}
        self._total = total
        self._n_types = len(self.counts) + 2
        self._bigram_lm: BigramLM | None = None

    @classmethod
    def from_counts(cls, counts: dict[str, int], bigrams: dict[str, int] | None = None,
                    min_count: int = 1) -> Vocab:
        chars = ["<pad>", "<unk>", "<empty>"] + sorted(c for c, n in counts.items() if n >= min_count)
        syls = {s.toneless for c in chars[3:] if (s := char_syllable(c)) is not None}
        return cls(chars, {c: counts[c] for c in chars[3:]}, ["<pad>", "<unk>"] + sorted(syls), bigrams or {})

    @classmethod
    def from_sentences(cls, sentences: list[str]) -> Vocab:
        """Count characters and character bigrams (with sentence start ^ and end $) of training text."""
        unigrams: Counter = Counter()
        bigrams: Counter = Counter()
        for sent in sentences:
            text = BOS + "".join(sent.split()) + EOS
            unigrams.update(text[1:-1])
            bigrams.update(text[i : i + 2] for i in range(len(text) - 1))
        unigrams[BOS] = unigrams[EOS] = len(sentences)
        kept = {b: n for b, n in bigrams.items() if n >= MIN_BIGRAM_COUNT}
        vocab = cls.from_counts({c: n for c, n in unigrams.items() if c not in (BOS, EOS)}, kept)
        vocab.counts[BOS] = vocab.counts[EOS] = len(sentences)
        return vocab

    def bigram_lm(self) -> BigramLM:
        """The smoothed bigram model of these counts (its prior's total and number of types as at construction), built
        on first use: every featurizer of this vocabulary shares its tables (`model.corrector.preload` builds them
        before gunicorn forks its workers)."""
        if self._bigram_lm is None:
            self._bigram_lm = BigramLM(self.counts, self.bigrams, self._total, self._n_types)
        return self._bigram_lm

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"chars": self.chars, "counts": self.counts, "syllables": self.syllables,
                                    "bigrams": self.bigrams}, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Vocab:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls(raw["chars"], raw["counts"], raw["syllables"], raw.get("bigrams", {}))


@dataclass
class Example:
    """Network inputs for one n-best list (numpy, unpadded) and the candidate strings for decoding."""

    top1: str
    chars: np.ndarray  # [L] int64
    syl: np.ndarray  # [L] int64
    tone: np.ndarray  # [L] int64
    bnd: np.ndarray  # [L] int64
    pos_feats: np.ndarray  # [L, P] float32
    cand_ids: np.ndarray  # [L, C, S] int64
    cand_feats: np.ndarray  # [L, C, F] float32
    cand_mask: np.ndarray  # [L, C] bool
    candidates: list[list[str]]
    labels: np.ndarray | None = None  # [L] int64, -100 where the truth is not a candidate
    rows: list[list[str]] = field(default_factory=list)  # each other hypothesis's segment per TOP1 position


@cython.locals(n=cython.Py_ssize_t, tags=list)
def boundary_tags(top1_words: list[str]) -> list[int]:
    """Tag each Han character of TOP1 as word begin / middle / end / single."""
    tags = []
    for word in top1_words:
        n = len(han_chars(word))
        if n == 1:
            tags.append(_SINGLE)
        elif n > 1:
            tags += [_BEGIN] + [_MIDDLE] * (n - 2) + [_END]
    return tags


class Featurizer:
    """Build Examples from n-best lists with a vocabulary and a confusion set.

    A position every hypothesis agrees on takes the fast path (`model.unanimous`) unless `fast` is False, which sends
    every position through the general one (`_candidate_rows`): the reference the fast path is held to.
    """

    def __init__(self, vocab: Vocab, confusion: ConfusionSet | None = None, fast: bool = True) -> None:
        self.vocab = vocab
        self.confusion = confusion or ConfusionSet(vocab.counts)
        self.lm = vocab.bigram_lm()
        self.fast = fast
        self.unanimous = UnanimousRows(self.lm, lambda char, ids, feats, mask: self._candidate_rows(
            0, char, {char: [0]}, 1, ids, feats, mask), MAX_CANDIDATES, MAX_SEGMENT)
        self._segment_memo: Memo[str, tuple[tuple[int, ...], float]] = Memo(MAX_MEMO_SEGMENTS)
        self._syllable_memo: Memo[str, tuple[int, int]] = Memo(MAX_MEMO_CHARS)  # a TOP1 character's id and tone
        self._similar_memo: Memo[str, dict[str, int]] = Memo(MAX_MEMO_CHARS)

    def _char_ids(self, seg: str) -> tuple[int, ...]:
        """A segment's character ids, padded to MAX_SEGMENT: a tuple, which the cyclic GC stops tracking once memoised
        (`_segment`; `hosting.loading.freeze_set_up`)."""
        if not seg:
            return (EMPTY,) + (PAD,) * (MAX_SEGMENT - 1)
        ids = tuple(self.vocab.char_id.get(c, UNK) for c in seg)
        return ids + (PAD,) * (MAX_SEGMENT - len(ids))

    def _log_freq(self, seg: str) -> float:
        if not seg:
            return 0.0
        return sum(self.vocab.log_freq.get(c, -LOG_FREQ_SCALE) for c in seg) / len(seg) / LOG_FREQ_SCALE

    # typed for the C compiler (compiled.py): the memos' and votes' lookups become direct dict calls, the LM terms C
    # doubles (the same IEEE additions), the vote share a C division of two small integers (as exact as Python's), the
    # rows written number by number through typed views (numpy's assignment of a list of tuples spent more on finding
    # their shape and types than on writing them, and a tuple per row cost its floats: issue 61), with the same casts
    # to int64 and float32
    @cython.locals(i=cython.Py_ssize_t, n_hyps=cython.Py_ssize_t, votes=dict, k=cython.Py_ssize_t, relation=dict,
                   segment_memo=dict, cands=list, offered=list, ranks=list, score=cython.double,
                   keep_lm=cython.double, term_l=cython.double, term_r=cython.double, edge_l=cython.double,
                   edge_r=cython.double, rel=cython.long, seg=str, seg_ids=tuple, f=cython.Py_ssize_t,
                   n_ranks=cython.Py_ssize_t, best=cython.Py_ssize_t, delta=cython.double, edge_scale=cython.double,
                   same_tone=cython.long, other_tone=cython.long, near=cython.long,
                   ids_out=cython.longlong[:, :, :], feats_out=cython.float[:, :, :], mask_out=cython.uchar[:, :])
    def _candidate_rows(self, i: int, top1: str, votes: dict[str, list[int]], n_hyps: int, ids_out: np.ndarray,
                        feats_out: np.ndarray, mask_out: np.ndarray) -> list[str]:
        """Write position i's candidates' character ids, feature rows (`CandidateFeatures`' columns, in order) and
        mask into its rows of the example's arrays (`ids_out` [L, C, S] int64, `feats_out` [L, C, F] float32,
        `mask_out` [L, C] uint8, zero where not written), and return the candidates.

        This runs for every candidate of every position the hypotheses disagree on, under the GIL beside the request
        threads: the per-segment constants (ids, log frequency) are memoised, keep's LM score is the first
        candidate's.
        """
        char = top1[i]
        variant = VARIANTS.get(char)
        offered = [seg for seg in votes if seg != char and seg != variant and len(seg) <= MAX_SEGMENT]
        cands = [char] + offered[:MAX_FROM_NBEST]
        relation = self._similar(char)
        for c in relation:
            if len(cands) >= MAX_CANDIDATES:
                break
            if c not in votes and c != variant:
                cands.append(c)
        left = top1[i - 1] if i > 0 else BOS
        right = top1[i + 1] if i + 1 < len(top1) else EOS
        # A one-character candidate's score is `BigramLM.score`'s two terms with the neighbours, summed alike, each
        # neighbour's bigrams with every candidate taken at once (most candidates are one character); another
        # segment is scored whole.
        lm = self.lm
        bigrams = zip(cands, *lm.follow(left, cands), *lm.precede(cands, right), strict=True)
        segment_memo = self._segment_memo.entries
        keep_lm = 0.0
        # the constants as C numbers (as module globals, each use was a Python object's arithmetic or comparison)
        edge_scale, same_tone, other_tone, near = EDGE_COUNT_SCALE, SAME_TONE, OTHER_TONE, NEAR
        for k, (seg, term_l, edge_l, term_r, edge_r) in enumerate(bigrams):
            if len(seg) == 1:
                score = term_l + term_r
            else:
                score, edge_l, edge_r = lm.score(left + seg + right)
            if k == 0:
                keep_lm = score
            ranks = votes.get(seg)
            rel = relation.get(seg, -1)
            seg_ids, log_freq = segment_memo.get(seg) or self._segment(seg)
            for f in range(MAX_SEGMENT):
                ids_out[i, k, f] = seg_ids[f]
            mask_out[i, k] = True
            n_ranks, best = 0, -1
            if ranks is not None:
                n_ranks, best = len(ranks), ranks[0]
            delta = lm_delta(score - keep_lm)  # scaled and clipped
            feats_out[i, k, 0] = k == 0  # keep
            feats_out[i, k, 1] = n_ranks / n_hyps if n_ranks else 0.0  # vote_share
            feats_out[i, k, 2] = 1.0 / (1 + best) if n_ranks else 0.0  # best_rank_inverse
            feats_out[i, k, 3] = seg == ""  # deletion
            feats_out[i, k, 4] = len(seg) > 1  # insertion
            feats_out[i, k, 5] = rel == same_tone  # same_tone
            feats_out[i, k, 6] = rel == other_tone  # other_tone
            feats_out[i, k, 7] = rel == near  # near_syllable
            feats_out[i, k, 8] = ranks is None  # not_offered
            feats_out[i, k, 9] = log_freq  # log_freq
            feats_out[i, k, 10] = best == 1  # offered_by_second
            feats_out[i, k, 11] = delta  # lm_delta
            feats_out[i, k, 12] = edge_l / edge_scale  # left_edge_count
            feats_out[i, k, 13] = edge_r / edge_scale  # right_edge_count
        return cands

    def _segment(self, seg: str) -> tuple[tuple[int, ...], float]:
        """Return a segment's character ids and log frequency feature, memoised (they depend on the vocabulary
        alone)."""
        value = self._segment_memo.entries[seg] = (self._char_ids(seg), self._log_freq(seg))
        return value

    def _syllable(self, char: str) -> tuple[int, int]:
        """A character's syllable id and tone (0, 0 where it has no reading), memoised."""
        s = char_syllable(char)
        value = (0, 0) if s is None else (self.vocab.syl_id.get(s.toneless, UNK), s.tone)
        self._syllable_memo.entries[char] = value
        return value

    def _similar(self, char: str) -> dict[str, int]:
        """A character's sound-alikes by relation, memoised."""
        value = self._similar_memo.entries.get(char)
        if value is None:
            value = self._similar_memo.entries[char] = dict(self.confusion.similar(char, MAX_CANDIDATES))
        return value

    def fill_memos(self) -> None:
        """Memoise each vocabulary character's syllable, sound-alikes and block now (~75 ms), not in the batch that
        first holds it: the same values (the vocabulary's alone); new lists featurized ~6 % faster (issue 61)."""
        for char in self.vocab.chars[3:]:  # after <pad>, <unk> and <empty>
            self._syllable(char)
            self._similar(char)
            self.unanimous.block(char)

    def featurize(self, nbest: NBest, truth: str | None = None) -> Example | None:
        """Return the Example of one n-best list, or None when TOP1 has no Han character."""
        return self.featurize_batch([nbest], [truth])[0]

    def featurize_batch(self, nbests: list[NBest], truths: list[str | None] | None = None) -> list[Example | None]:
        """Return the Example of each n-best list (None where TOP1 has no Han character): one list at a time, then
        the rows every hypothesis agrees on for all of them at once (`UnanimousRows.fill`).

        The batch's candidate arrays are allocated once, each Example's a slice of them (its TOP1's rows), so that the
        unanimous rows of the whole batch are written by one assignment per array (issue 61)."""
        for memo in (self._segment_memo, self._syllable_memo, self._similar_memo, self.unanimous):
            memo.bound()  # between batches: a batch's rows stay valid until written
        top1s = [han_chars(nbest.sentences[0])[:MAX_LEN] for nbest in nbests]
        rows = sum(map(len, top1s))
        pending = Pending(np.zeros((rows, MAX_CANDIDATES, MAX_SEGMENT), dtype=np.int64),
                          np.zeros((rows, MAX_CANDIDATES, N_CAND_FEATS), dtype=np.float32),
                          np.zeros((rows, MAX_CANDIDATES), dtype=bool))
        examples: list[Example | None] = []
        start = 0
        for nbest, top1, truth in zip(nbests, top1s, truths or [None] * len(nbests), strict=True):
            examples.append(self._featurize(nbest, top1, truth, pending, start) if top1 else None)
            start += len(top1)
        self.unanimous.fill(pending)
        return examples

    @cython.locals(n_hyps=cython.Py_ssize_t, L=cython.Py_ssize_t, i=cython.Py_ssize_t, rank=cython.Py_ssize_t,
                   start=cython.Py_ssize_t, char_ids=list, candidates=list, columns=list, syllable=tuple,
                   column=tuple, syllable_memo=dict, blocks_memo=dict, votes=dict,
                   padded=str, top1=str, char=str, agreement=cython.double, alternatives=cython.double,
                   syl_out=cython.longlong[:], tone_out=cython.longlong[:], pos_out=cython.float[:, :],
                   hyps_feature=cython.double, max_len=cython.double, unk=cython.long)
    def _featurize(self, nbest: NBest, top1: str, truth: str | None, pending: Pending, start: int) -> Example:
        """One list's Example (TOP1's Han characters `top1`, not empty), its candidate arrays the rows from `start` of
        the batch's (`pending`'s), its unanimous positions' rows left to `UnanimousRows.fill` (added to `pending`)."""
        others = [han_chars(s) for s in nbest.sentences[1:]]
        n_hyps = 1 + len(others)
        rows = align_nbest(top1, others)
        tags = boundary_tags(nbest.sentences[0].split())[: len(top1)]
        tags += [BOUNDARY["S"]] * (len(top1) - len(tags))
        L = len(top1)
        char_ids = [self.vocab.char_id.get(c, UNK) for c in top1]
        cand_ids, cand_feats = pending.cand_ids[start : start + L], pending.cand_feats[start : start + L]
        cand_mask = pending.cand_mask[start : start + L]
        example = Example(top1, np.array(char_ids, dtype=np.int64), np.zeros(L, dtype=np.int64),
                          np.zeros(L, dtype=np.int64), np.array(tags, dtype=np.int64), np.zeros((L, N_POS_FEATS),
                          dtype=np.float32), cand_ids, cand_feats, cand_mask, [], None, rows)
        candidates = example.candidates
        # the position rows written number by number through typed views, as `_candidate_rows` writes its own
        mask = cand_mask.view(np.uint8)
        syl_out, tone_out, pos_out = example.syl, example.tone, example.pos_feats
        hyps_feature, max_len, unk = n_hyps / HYPOTHESES_SCALE, MAX_LEN, UNK
        columns = list(zip(*rows, strict=True)) if rows else [()] * L  # each position's segments, one per hypothesis
        syllable_memo, fast = self._syllable_memo.entries, self.fast
        blocks_memo = self.unanimous.blocks.entries
        padded = BOS + top1 + EOS
        for i, char in enumerate(top1):
            syllable = syllable_memo.get(char) or self._syllable(char)
            syl_out[i], tone_out[i] = syllable[0], syllable[1]
            column = columns[i]
            block = None
            if fast and column.count(char) == len(column):
                block = blocks_memo[char] if char in blocks_memo else self.unanimous.block(char)
            if block is not None:  # every hypothesis agrees: its rows are written batch-wide (`UnanimousRows.fill`)
                agreement, alternatives = 1.0, 0.0
                pending.positions.append(start + i)
                pending.blocks.append(block.row)
                pending.cands.append(block.cands)
                pending.left.append(padded[i])
                pending.right.append(padded[i + 2])
                candidates.append(block.cands)
            else:
                votes: dict[str, list[int]] = {char: [0]}
                for rank, seg in enumerate(column, start=1):
                    votes.setdefault(seg, []).append(rank)
                agreement, alternatives = len(votes[char]) / n_hyps, (len(votes) - 1) / ALTERNATIVES_SCALE
                candidates.append(self._candidate_rows(i, top1, votes, n_hyps, cand_ids, cand_feats, mask))
            pos_out[i, 0], pos_out[i, 1], pos_out[i, 2] = agreement, alternatives, hyps_feature
            pos_out[i, 3], pos_out[i, 4] = char_ids[i] == unk, i / max_len
        if truth is not None:
            gold = align_to(top1, truth)
            example.labels = np.array([c.index(g) if g in c else -100 for c, g in zip(candidates, gold, strict=True)],
                                      dtype=np.int64)
        return example


def collate(examples: list[Example]) -> dict[str, np.ndarray]:
    """Pad a list of Examples to the batch's own longest TOP1 and stack them."""
    B = len(examples)
    L = max(len(e.top1) for e in examples)
    out = {
        "chars": np.zeros((B, L), np.int64),
        "syl": np.zeros((B, L), np.int64),
        "tone": np.zeros((B, L), np.int64),
        "bnd": np.zeros((B, L), np.int64),
        "pos_feats": np.zeros((B, L, N_POS_FEATS), np.float32),
        "cand_ids": np.zeros((B, L, MAX_CANDIDATES, MAX_SEGMENT), np.int64),
        "cand_feats": np.zeros((B, L, MAX_CANDIDATES, N_CAND_FEATS), np.float32),
        "cand_mask": np.zeros((B, L, MAX_CANDIDATES), bool),
        "attn_mask": np.zeros((B, L), np.int64),
        "labels": np.full((B, L), -100, np.int64),
    }
    for b, e in enumerate(examples):
        n = len(e.top1)
        for key in ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask"):
            out[key][b, :n] = getattr(e, key)
        out["cand_mask"][b, n:, 0] = True  # padded positions keep a valid "keep" so softmax stays finite
        out["attn_mask"][b, :n] = 1
        if e.labels is not None:
            out["labels"][b, :n] = e.labels
    return out
