"""The featurizer's memos, all bounded one way: emptied whole between batches once they hold their limit.

Their values depend on the vocabulary alone, so emptying one changes no array. They are emptied only between batches
(`Featurizer.featurize_batch` calls `bound`), never in the middle of one: the rows a batch has collected in a
`MemoTable` stay valid until the batch is written. A memo thus holds at most its limit plus one batch's entries.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """`entries`, a plain dict (its lookups are the cheapest: the featurizer's loops read it inline), bounded by
    `bound`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: dict[K, V] = {}

    def bound(self) -> None:
        """Forget every entry once `limit` are held."""
        if len(self.entries) >= self.limit:
            self.entries.clear()


class MemoTable(Memo[str, V]):
    """Fixed-shape numpy rows memoised by a string key, gathered for a whole batch by one fancy index (`take`): a
    batch's ~800 unanimous positions stacked one small array at a time (np.stack) cost 4 ms of featurization's 24
    (issue 21). `entries` maps a key to what its caller keeps of it (a row's index, or an object that holds it);
    `bound` frees the rows with the entries (their space is reused)."""

    def __init__(self, limit: int, *columns: tuple[tuple[int, ...], type]) -> None:
        super().__init__(limit)
        self.used = 0
        self.tables = [np.zeros((256, *shape), dtype) for shape, dtype in columns]

    def append(self, *values: object) -> int:
        """Write a row (one value per column) and return its index."""
        row = self.reserve()
        for table, value in zip(self.tables, values, strict=True):
            table[row] = value
        return row

    def reserve(self) -> int:
        """The index of a new row, for the caller to write whole in every column (it holds what it held before: a row
        freed by `bound` is reused as it was)."""
        row = self.used
        if row == len(self.tables[0]):
            self.tables = [np.concatenate([t, np.zeros_like(t)]) for t in self.tables]
        self.used += 1
        return row

    def take(self, rows: list[int]) -> list[np.ndarray]:
        """Each column's rows, in order (copies)."""
        index = np.array(rows, dtype=np.intp)
        return [table[index] for table in self.tables]

    def bound(self) -> None:
        if len(self.entries) >= self.limit:
            self.entries.clear()
            self.used = 0
