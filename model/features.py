"""Turn n-best lists into the corrector's inputs: TOP1 positions, each with a small candidate set.

Per TOP1 position the candidates are: keep (index 0); the distinct segments the other hypotheses align
there (substitutions, deletions as "", insertions as two characters), by best rank; then characters of
the same or a near syllable. The network picks one candidate per position, so it can only insert or
delete where the n-best offers it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.contract import (
    ALTERNATIVES_SCALE,
    CANDIDATE_FEATURES,
    EDGE_COUNT_SCALE,
    HYPOTHESES_SCALE,
    LM_DELTA_SCALE,
    LOG_FREQ_SCALE,
    POSITION_FEATURES,
    FeatureContractError,
    PositionFeatures,
)
from preprocess.align import align_nbest, align_to
from preprocess.confusion import NEAR, OTHER_TONE, SAME_TONE, VARIANTS, ConfusionSet
from preprocess.phones import char_syllable
from preprocess.text import NBest, han_only

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
# Segments (one or two characters, or none) whose ids and log frequency are memoised at once.
MAX_MEMO_SEGMENTS = 100_000
# Neighbour-character pairs whose bigram terms are memoised, per side (about 30 MB each when full).
MAX_MEMO_PAIRS = 100_000
# The columns in the order Featurizer._candidate_rows writes them (plain tuples, for speed): the contract's.
_CANDIDATE_ROW = ("keep", "vote_share", "best_rank_inverse", "deletion", "insertion", "same_tone", "other_tone",
                  "near_syllable", "not_offered", "log_freq", "offered_by_second", "lm_delta", "left_edge_count",
                  "right_edge_count")
_NO_COUNTS: dict[str, int] = {}
# The columns that depend on a position's neighbours (lm_delta and the two edge counts), in order.
_LM_COLUMNS = slice(_CANDIDATE_ROW.index("lm_delta"), _CANDIDATE_ROW.index("right_edge_count") + 1)
if _CANDIDATE_ROW != CANDIDATE_FEATURES:
    raise FeatureContractError(f"model/features.py writes candidate columns {_CANDIDATE_ROW}, the contract names "
                               f"{CANDIDATE_FEATURES}: update Featurizer._candidate_rows with the contract")


@dataclass
class Vocab:
    """Characters and syllables known to the network, with character and character-bigram counts of the
    training text (the bigrams give each candidate a language-model score in its TOP1 context)."""

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

    def bigram_logp(self, a: str, b: str) -> float:
        """log P(b | a), the bigram estimate smoothed towards the unigram one."""
        p_b = (self.counts.get(b, 0) + 1) / (self._total + self._n_types)
        return math.log((self.bigrams.get(a + b, 0) + 5.0 * p_b) / (self.counts.get(a, 0) + 5.0))

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


class _MemoTable:
    """Fixed-shape numpy rows memoised by a string key, gathered for a whole batch by one fancy index (`take`): a
    batch's ~800 unanimous positions stacked one small array at a time (np.stack) cost 4 ms of featurization's 24
    (issue 21). Bounded like the other memos, but emptied only between batches (`bound`): the rows a batch has
    collected stay valid until `_fill_unanimous` writes them."""

    def __init__(self, *columns: tuple[tuple[int, ...], type]) -> None:
        self.rows: dict[str, int] = {}
        self.tables = [np.zeros((256, *shape), dtype) for shape, dtype in columns]

    def add(self, key: str, *values: object) -> int:
        """Store a key's row (one value per column) and return its index."""
        row = len(self.rows)
        if row == len(self.tables[0]):
            self.tables = [np.concatenate([t, np.zeros_like(t)]) for t in self.tables]
        for table, value in zip(self.tables, values, strict=True):
            table[row] = value
        self.rows[key] = row
        return row

    def take(self, rows: list[int]) -> list[np.ndarray]:
        """Each column's rows, in order (copies)."""
        index = np.array(rows, dtype=np.intp)
        return [table[index] for table in self.tables]

    def bound(self, limit: int) -> None:
        """Forget every row once `limit` are held (their space is reused)."""
        if len(self.rows) >= limit:
            self.rows.clear()


@dataclass(frozen=True)
class _Block:
    """A character's rows where every hypothesis agrees with it (`Featurizer._unanimous_block`): its candidates, and
    its row of `Featurizer._blocks` (their ids, their feature rows with the LM columns 0, their mask)."""

    cands: list[str]
    row: int
    priors: list[float]  # each candidate's smoothing prior, its log, and its log denominator (`Featurizer._lm`)
    log_priors: list[float]
    log_dens: list[float]


@dataclass
class _Unanimous:
    """An Example's positions every hypothesis agrees on, with their blocks' rows and the rows of each one's bigram
    terms with its left and right neighbour (`_left_terms`, `_right_terms`): written batch-wide (`_fill_unanimous`)."""

    example: Example
    positions: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)


def boundary_tags(top1_words: list[str]) -> list[int]:
    """Tag each Han character of TOP1 as word begin / middle / end / single."""
    tags: list[int] = []
    for word in top1_words:
        n = len(han_only(word))
        if n == 1:
            tags.append(BOUNDARY["S"])
        elif n > 1:
            tags += [BOUNDARY["B"]] + [BOUNDARY["M"]] * (n - 2) + [BOUNDARY["E"]]
    return tags


class Featurizer:
    """Build Examples from n-best lists with a vocabulary and a confusion set."""

    def __init__(self, vocab: Vocab, confusion: ConfusionSet | None = None) -> None:
        self.vocab = vocab
        self.confusion = confusion or ConfusionSet(vocab.counts)
        # Vocab.bigram_logp(a, b) = log(count(ab) + prior[b]) - log_den[a]
        total, n_types = vocab._total, vocab._n_types
        self._prior = {c: 5.0 * (n + 1) / (total + n_types) for c, n in vocab.counts.items()}
        self._prior_unk = 5.0 / (total + n_types)
        self._log_prior = {c: math.log(p) for c, p in self._prior.items()}
        self._log_prior_unk = math.log(self._prior_unk)
        self._log_den = {c: math.log(n + 5.0) for c, n in vocab.counts.items()}
        self._log_den_unk = math.log(5.0)
        self._similar_cache: dict[str, dict[str, int]] = {}
        self._unanimous_memo: dict[str, _Block | None] = {}
        # the blocks' ids [MAX_CANDIDATES, MAX_SEGMENT], feature rows (LM columns 0) and mask, by character
        self._blocks = _MemoTable(((MAX_CANDIDATES, MAX_SEGMENT), np.int64),
                                  ((MAX_CANDIDATES, N_CAND_FEATS), np.float32), ((MAX_CANDIDATES,), bool))
        # The bigram counts by their first character and by their second: a position's two neighbours look up
        # every candidate's bigrams with them (`_left_terms`, `_right_terms`).
        self._after: dict[str, dict[str, int]] = {}
        self._before: dict[str, dict[str, int]] = {}
        for pair, n in vocab.bigrams.items():
            self._after.setdefault(pair[0], {})[pair[1]] = n
            self._before.setdefault(pair[1], {})[pair[0]] = n
        self._segment_memo: dict[str, tuple[tuple[int, ...], float]] = {}
        # a neighbour and a character -> its block's bigram terms on that side (`_left_terms`, `_right_terms`)
        self._left_memo = _MemoTable(((2, MAX_CANDIDATES), np.float64))
        self._right_memo = _MemoTable(((2, MAX_CANDIDATES), np.float64))
        # a TOP1 character -> its syllable id and tone
        self._syllable_memo: dict[str, tuple[int, int]] = {}

    def _char_ids(self, seg: str) -> tuple[int, ...]:
        """A segment's character ids, padded to MAX_SEGMENT: a tuple, which the cyclic GC stops tracking once memoised
        (`_segment`; `api.loading.freeze_set_up`)."""
        if not seg:
            return (EMPTY,) + (PAD,) * (MAX_SEGMENT - 1)
        ids = tuple(self.vocab.char_id.get(c, UNK) for c in seg)
        return ids + (PAD,) * (MAX_SEGMENT - len(ids))

    def _log_freq(self, seg: str) -> float:
        if not seg:
            return 0.0
        return sum(self.vocab.log_freq.get(c, -LOG_FREQ_SCALE) for c in seg) / len(seg) / LOG_FREQ_SCALE

    def _lm(self, left: str, seg: str, right: str) -> tuple[float, float, float]:
        """Score a segment between its TOP1 neighbours: log P(left seg right), and its two edge bigrams.

        Vocab.bigram_logp, summed left to right: log(count(ab) + prior(b)) - log_den(a) per bigram, with the log
        of the prior taken once per character for the unseen bigrams (most of them): this runs for every candidate
        of every position of every request.
        """
        text = left + seg + right
        bigrams, log_prior, log_den = self.vocab.bigrams, self._log_prior, self._log_den
        score = first = last = 0.0
        for k in range(len(text) - 1):
            a, b = text[k], text[k + 1]
            n = bigrams.get(text[k : k + 2], 0)
            if n:
                term = math.log(n + self._prior.get(b, self._prior_unk)) - log_den.get(a, self._log_den_unk)
                last = math.log1p(n)
            else:
                term = log_prior.get(b, self._log_prior_unk) - log_den.get(a, self._log_den_unk)
                last = 0.0
            if k == 0:
                first = last
            score += term
        return score, first, last

    def _candidate_rows(self, i: int, top1: str, votes: dict[str, list[int]], n_hyps: int) -> tuple[
            list[str], list[tuple[int, ...]], list[tuple[float, ...]]]:
        """Return one position's candidates, their character ids and their feature rows (`CandidateFeatures`'
        columns, in order, as plain tuples).

        This runs for every candidate of every position of every request, under the GIL beside the request
        threads: the per-segment constants (ids, log frequency) are memoised, keep's LM score is the first
        candidate's, and the rows are built as tuples rather than through the NamedTuple's keywords.
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
        # A one-character candidate's score is `_lm`'s two terms with the neighbours, summed alike; what depends on a
        # neighbour alone is looked up once per position (most candidates are one character).
        after_left, before_right = self._after.get(left, _NO_COUNTS), self._before.get(right, _NO_COUNTS)
        den_left = self._log_den.get(left, self._log_den_unk)
        prior_right = self._prior.get(right, self._prior_unk)
        log_prior_right = self._log_prior.get(right, self._log_prior_unk)
        prior, log_prior, log_den = self._prior, self._log_prior, self._log_den
        prior_unk, log_prior_unk, log_den_unk = self._prior_unk, self._log_prior_unk, self._log_den_unk
        lm = self._lm
        segment_memo = self._segment_memo
        keep_lm = 0.0
        ids, feats = [], []
        for k, seg in enumerate(cands):
            if len(seg) == 1:
                n_left, n_right = after_left.get(seg, 0), before_right.get(seg, 0)
                term_left = (math.log(n_left + prior.get(seg, prior_unk)) if n_left
                             else log_prior.get(seg, log_prior_unk)) - den_left
                den_seg = log_den.get(seg, log_den_unk)
                term_right = (math.log(n_right + prior_right) if n_right else log_prior_right) - den_seg
                score = term_left + term_right
                edge_l = math.log1p(n_left) if n_left else 0.0
                edge_r = math.log1p(n_right) if n_right else 0.0
            else:
                score, edge_l, edge_r = lm(left, seg, right)
            if k == 0:
                keep_lm = score
            ranks = votes.get(seg)
            rel = relation.get(seg, -1)
            seg_ids, log_freq = segment_memo.get(seg) or self._segment(seg)
            delta = (score - keep_lm) / LM_DELTA_SCALE
            ids.append(seg_ids)
            feats.append((
                k == 0,  # keep
                len(ranks) / n_hyps if ranks else 0.0,  # vote_share
                1.0 / (1 + ranks[0]) if ranks else 0.0,  # best_rank_inverse
                seg == "",  # deletion
                len(seg) > 1,  # insertion
                rel == SAME_TONE,  # same_tone
                rel == OTHER_TONE,  # other_tone
                rel == NEAR,  # near_syllable
                ranks is None,  # not_offered
                log_freq,  # log_freq
                ranks is not None and ranks[0] == 1,  # offered_by_second
                3.0 if delta > 3.0 else -3.0 if delta < -3.0 else delta,  # lm_delta, clipped
                edge_l / EDGE_COUNT_SCALE,  # left_edge_count
                edge_r / EDGE_COUNT_SCALE,  # right_edge_count
            ))
        return cands, ids, feats

    def _unanimous_block(self, char: str) -> _Block | None:
        """A character's candidates where no hypothesis offers another segment, with their ids, mask and the feature
        columns that do not depend on the neighbours (the LM ones left 0), padded to MAX_CANDIDATES rows, and each
        candidate's prior terms; memoised and bounded like the segments. None when a candidate is not a single
        character (the general path then)."""
        if char in self._unanimous_memo:
            return self._unanimous_memo[char]
        cands, ids, rows = self._candidate_rows(0, char, {char: [0]}, 1)
        value = None
        if all(len(seg) == 1 for seg in cands):
            n = len(cands)
            block_ids = np.zeros((MAX_CANDIDATES, MAX_SEGMENT), dtype=np.int64)
            block_ids[:n] = ids
            feats = np.zeros((MAX_CANDIDATES, N_CAND_FEATS), dtype=np.float32)
            feats[:n] = rows
            feats[:, _LM_COLUMNS] = 0.0
            value = _Block(cands, self._blocks.add(char, block_ids, feats, np.arange(MAX_CANDIDATES) < n),
                           [self._prior.get(c, self._prior_unk) for c in cands],
                           [self._log_prior.get(c, self._log_prior_unk) for c in cands],
                           [self._log_den.get(c, self._log_den_unk) for c in cands])
        self._unanimous_memo[char] = value
        return value

    def _left_terms(self, left: str, char: str, block: _Block) -> int:
        """The row of `_left_memo` [2, MAX_CANDIDATES] of each candidate's bigram term after `left` (as `_lm` computes
        it) and its left edge count column; memoised by the pair (the pairs of real text repeat), bounded."""
        key = left + char
        row = self._left_memo.rows.get(key)
        if row is None:
            after_left = self._after.get(left, _NO_COUNTS)
            den_left = self._log_den.get(left, self._log_den_unk)
            terms, edges = [0.0] * MAX_CANDIDATES, [0.0] * MAX_CANDIDATES  # a row's two lines, written at once
            for k, seg in enumerate(block.cands):
                n = after_left.get(seg, 0)
                terms[k] = (math.log(n + block.priors[k]) if n else block.log_priors[k]) - den_left
                edges[k] = (math.log1p(n) if n else 0.0) / EDGE_COUNT_SCALE
            row = self._left_memo.add(key, (terms, edges))
        return row

    def _right_terms(self, char: str, right: str, block: _Block) -> int:
        """The row of `_right_memo` of each candidate's bigram term before `right` and its right edge count column."""
        key = char + right
        row = self._right_memo.rows.get(key)
        if row is None:
            before_right = self._before.get(right, _NO_COUNTS)
            prior_right = self._prior.get(right, self._prior_unk)
            log_prior_right = self._log_prior.get(right, self._log_prior_unk)
            terms, edges = [0.0] * MAX_CANDIDATES, [0.0] * MAX_CANDIDATES
            for k, seg in enumerate(block.cands):
                n = before_right.get(seg, 0)
                terms[k] = (math.log(n + prior_right) if n else log_prior_right) - block.log_dens[k]
                edges[k] = (math.log1p(n) if n else 0.0) / EDGE_COUNT_SCALE
            row = self._right_memo.add(key, (terms, edges))
        return row

    def _fill_unanimous(self, pending: list[_Unanimous]) -> None:
        """Write the rows of the positions every hypothesis agrees on (about 70 % of them), for a whole batch of lists
        at once: each character's memoised block, with the LM columns (lm_delta and the two edge counts) of its
        neighbours, the pair terms added, differenced against keep, scaled and clipped as `_candidate_rows` does,
        zero past the candidates; float64 until the float32 rows, so the same values to the bit
        (tests/model/test_features.py). A few numpy calls per batch rather than per position (issue 21)."""
        blocks = [b for p in pending for b in p.blocks]
        if not blocks:
            return
        (left,) = self._left_memo.take([t for p in pending for t in p.left])  # [N, 2, MAX_CANDIDATES]
        (right,) = self._right_memo.take([t for p in pending for t in p.right])
        score = left[:, 0] + right[:, 0]
        delta = np.clip((score - score[:, :1]) / LM_DELTA_SCALE, -3.0, 3.0)
        ids, feats, mask = self._blocks.take(blocks)
        feats[:, :, _LM_COLUMNS] = np.where(mask[:, :, None], np.stack((delta, left[:, 1], right[:, 1]), axis=-1), 0.0)
        start = 0
        for p in pending:
            end = start + len(p.positions)
            p.example.cand_ids[p.positions] = ids[start:end]
            p.example.cand_feats[p.positions] = feats[start:end]
            p.example.cand_mask[p.positions] = mask[start:end]
            start = end

    def _segment(self, seg: str) -> tuple[tuple[int, ...], float]:
        """Return a segment's character ids and log frequency feature, memoised (they depend on the vocabulary
        alone; the memo is emptied when it reaches MAX_MEMO_SEGMENTS, so it stays bounded whatever comes in)."""
        value = self._segment_memo.get(seg)
        if value is None:
            if len(self._segment_memo) >= MAX_MEMO_SEGMENTS:
                self._segment_memo.clear()
            value = self._segment_memo[seg] = (self._char_ids(seg), self._log_freq(seg))
        return value

    def _syllable(self, char: str) -> tuple[int, int]:
        """A character's syllable id and tone (0, 0 where it has no reading), memoised and bounded."""
        s = char_syllable(char)
        value = (self.vocab.syl_id.get(s.toneless, UNK), s.tone) if s is not None else (0, 0)
        if len(self._syllable_memo) >= MAX_MEMO_SEGMENTS:
            self._syllable_memo.clear()
        self._syllable_memo[char] = value
        return value

    def _similar(self, char: str) -> dict[str, int]:
        value = self._similar_cache.get(char)
        if value is None:
            value = self._similar_cache[char] = dict(self.confusion.similar(char, MAX_CANDIDATES))
        return value

    def featurize(self, nbest: NBest, truth: str | None = None) -> Example | None:
        """Return the Example of one n-best list, or None when TOP1 has no Han character."""
        return self.featurize_batch([nbest], [truth])[0]

    def featurize_batch(self, nbests: list[NBest], truths: list[str | None] | None = None) -> list[Example | None]:
        """Return the Example of each n-best list (None where TOP1 has no Han character): one list at a time, then
        the rows every hypothesis agrees on for all of them at once (`_fill_unanimous`)."""
        self._left_memo.bound(MAX_MEMO_PAIRS)  # between batches: a batch's rows stay valid until written
        self._right_memo.bound(MAX_MEMO_PAIRS)
        if len(self._unanimous_memo) >= MAX_MEMO_SEGMENTS:
            self._unanimous_memo.clear()
            self._blocks.rows.clear()
        pending: list[_Unanimous] = []
        examples = [self._featurize(nbest, truth, pending)
                    for nbest, truth in zip(nbests, truths or [None] * len(nbests), strict=True)]
        self._fill_unanimous(pending)
        return examples

    def _featurize(self, nbest: NBest, truth: str | None, pending: list[_Unanimous]) -> Example | None:
        """One list's Example, its unanimous positions' rows left to `_fill_unanimous` (appended to `pending`)."""
        top1 = han_only(nbest.sentences[0])[:MAX_LEN]
        if not top1:
            return None
        others = [han_only(s) for s in nbest.sentences[1:]]
        n_hyps = 1 + len(others)
        rows = align_nbest(top1, others)
        tags = boundary_tags(nbest.sentences[0].split())[: len(top1)]
        tags += [BOUNDARY["S"]] * (len(top1) - len(tags))
        L = len(top1)
        char_ids = [self.vocab.char_id.get(c, UNK) for c in top1]
        cand_ids = np.zeros((L, MAX_CANDIDATES, MAX_SEGMENT), dtype=np.int64)
        cand_feats = np.zeros((L, MAX_CANDIDATES, N_CAND_FEATS), dtype=np.float32)
        cand_mask = np.zeros((L, MAX_CANDIDATES), dtype=bool)
        example = Example(top1, np.array(char_ids, dtype=np.int64), np.zeros(L, dtype=np.int64),
                          np.zeros(L, dtype=np.int64), np.array(tags, dtype=np.int64), np.zeros((L, N_POS_FEATS),
                          dtype=np.float32), cand_ids, cand_feats, cand_mask, [], None, rows)
        candidates = example.candidates
        unanimous = _Unanimous(example)
        syllables: list[tuple[int, int]] = []
        pos_rows = []
        columns = list(zip(*rows, strict=True)) if rows else [()] * L  # each position's segments, one per hypothesis
        syllable_memo, blocks_memo = self._syllable_memo, self._unanimous_memo
        left_memo, right_memo = self._left_memo.rows, self._right_memo.rows
        padded = BOS + top1 + EOS
        for i, char in enumerate(top1):
            syllables.append(syllable_memo.get(char) or self._syllable(char))
            column = columns[i]
            block = None
            if column.count(char) == len(column):
                block = blocks_memo[char] if char in blocks_memo else self._unanimous_block(char)
            if block is not None:  # every hypothesis agrees: its rows are written batch-wide (`_fill_unanimous`)
                agreement, alternatives = 1.0, 0.0
                unanimous.positions.append(i)
                unanimous.blocks.append(block.row)
                left, right = padded[i], padded[i + 2]
                terms = left_memo.get(left + char)
                unanimous.left.append(terms if terms is not None else self._left_terms(left, char, block))
                terms = right_memo.get(char + right)
                unanimous.right.append(terms if terms is not None else self._right_terms(char, right, block))
                candidates.append(block.cands)
            else:
                votes: dict[str, list[int]] = {char: [0]}
                for rank, seg in enumerate(column, start=1):
                    votes.setdefault(seg, []).append(rank)
                agreement, alternatives = len(votes[char]) / n_hyps, (len(votes) - 1) / ALTERNATIVES_SCALE
                cands, ids, feats = self._candidate_rows(i, top1, votes, n_hyps)
                candidates.append(cands)
                n = len(cands)
                cand_ids[i, :n] = ids
                cand_feats[i, :n] = feats
                cand_mask[i, :n] = True
            pos_rows.append(PositionFeatures(agreement, alternatives, n_hyps / HYPOTHESES_SCALE, char_ids[i] == UNK,
                                             i / MAX_LEN))
        if unanimous.positions:
            pending.append(unanimous)
        example.syl[:], example.tone[:] = zip(*syllables, strict=True)
        example.pos_feats[:] = pos_rows
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
