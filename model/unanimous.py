"""The featurizer's fast path (issue 21): the rows of the positions every hypothesis agrees on, about 70 % of them.

Featurization runs for every request, under the GIL beside the request threads, so the positions where the n-best offers
nothing but TOP1's character skip the general path (`Featurizer._candidate_rows`): such a position's candidates and all
its columns but the three LM ones depend on its character alone (a memoised block), and its LM columns on its character
and each neighbour; a whole batch's rows are then written at once (`UnanimousRows.fill`): the blocks gathered by one
fancy index, every position's bigram terms by one call of `BigramLM.sides`.

Its contract is the bit-equality test: the same arrays as the general path gives every position
(tests/model/test_unanimous.py), float64 until the float32 rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from model.bigram import BigramLM, lm_delta
from model.contract import CANDIDATE_FEATURES, EDGE_COUNT_SCALE
from model.memo import MemoTable

# Characters whose blocks are memoised at once (about 30 MB when full).
MAX_MEMO_BLOCKS = 100_000
# The columns that depend on a position's neighbours, side by side in this order (model.features checks the
# contract's order at import): lm_delta and the two edge counts.
LM_COLUMNS = slice(CANDIDATE_FEATURES.index("lm_delta"), CANDIDATE_FEATURES.index("right_edge_count") + 1)

# A lone character's candidates by the general path, their character ids, feature rows and mask written into the
# arrays given ([1, C, S] int64, [1, C, F] float32, [1, C] uint8, zero): `Featurizer._candidate_rows`.
RowsOf = Callable[[str, np.ndarray, np.ndarray, np.ndarray], list[str]]


@dataclass(frozen=True)
class Block:
    """A character's candidates where every hypothesis agrees with it, and its row of `UnanimousRows.blocks` (their
    ids, their feature rows with the LM columns 0, their mask)."""

    cands: list[str]
    row: int


@dataclass
class Pending:
    """A batch's candidate arrays (every example's rows, one after the other) and its unanimous positions (rows of
    them), with their blocks' rows, candidates and left and right neighbours, to be written by `UnanimousRows.fill`."""

    cand_ids: np.ndarray
    cand_feats: np.ndarray
    cand_mask: np.ndarray
    positions: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    cands: list[list[str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    right: list[str] = field(default_factory=list)


class UnanimousRows:
    """The memoised blocks, read inline by `Featurizer._featurize` (the `entries` of `blocks`: a key present is a hit)
    and filled on a miss (`block`), and the batch's rows written by `fill`."""

    def __init__(self, lm: BigramLM, rows_of: RowsOf, max_candidates: int, max_segment: int) -> None:
        self.lm = lm
        self.rows_of = rows_of
        self.max_candidates = max_candidates
        n_feats = len(CANDIDATE_FEATURES)
        # a character -> its Block (None where a candidate is not one character): ids, feature rows, mask
        self.blocks: MemoTable[Block | None] = MemoTable(
            MAX_MEMO_BLOCKS, ((max_candidates, max_segment), np.int64), ((max_candidates, n_feats), np.float32),
            ((max_candidates,), bool))

    def bound(self) -> None:
        """Bound the memo: between batches only, so a batch's rows stay valid until `fill` writes them."""
        self.blocks.bound()

    def block(self, char: str) -> Block | None:
        """A character's candidates where no hypothesis offers another segment, with their ids, mask and the feature
        columns that do not depend on the neighbours (the LM ones left 0), padded to max_candidates rows; memoised.
        None when a candidate is not a single character (the general path then)."""
        if char in self.blocks.entries:
            return self.blocks.entries[char]
        ids_table, feats_table, _ = self.blocks.tables
        block_ids = np.zeros((1, *ids_table.shape[1:]), dtype=ids_table.dtype)
        feats = np.zeros((1, *feats_table.shape[1:]), dtype=feats_table.dtype)
        mask = np.zeros((1, self.max_candidates), dtype=np.uint8)
        cands = self.rows_of(char, block_ids, feats, mask)
        value = None
        if all(len(seg) == 1 for seg in cands):
            feats[:, :, LM_COLUMNS] = 0.0
            value = Block(cands, self.blocks.append(block_ids[0], feats[0], mask[0].view(bool)))
        self.blocks.entries[char] = value
        return value

    def fill(self, pending: Pending) -> None:
        """Write the rows of a batch's unanimous positions at once: each one's block, with the LM columns of its
        neighbours, the pair terms added, differenced against keep, scaled and clipped as the general path does,
        zero past the candidates. A few calls per batch rather than per position (issues 21 and 61): the bigrams
        asked of `BigramLM.sides` for every position at once (memoised per neighbour pair, their look-ups and the
        misses' Python lists cost more than the bigrams), the rows written by one assignment per array."""
        if not pending.blocks:
            return
        sides = np.zeros((len(pending.blocks), 4, self.max_candidates))  # [N, follow's terms and edges, precede's, C]
        self.lm.sides(pending.left, pending.cands, pending.right, sides)
        score = sides[:, 0] + sides[:, 2]
        delta = lm_delta(score - score[:, :1])
        ids, feats, mask = self.blocks.take(pending.blocks)
        edges = (sides[:, 1] / EDGE_COUNT_SCALE, sides[:, 3] / EDGE_COUNT_SCALE)
        feats[:, :, LM_COLUMNS] = np.where(mask[:, :, None], np.stack((delta, *edges), axis=-1), 0.0)
        rows = np.array(pending.positions, dtype=np.intp)
        pending.cand_ids[rows] = ids
        pending.cand_feats[rows] = feats
        pending.cand_mask[rows] = mask
