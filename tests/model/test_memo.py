import numpy as np

from model.memo import Memo, MemoTable


def test_a_memo_is_emptied_by_bound_only_once_it_holds_its_limit():
    memo: Memo[str, int] = Memo(2)
    memo.entries["a"] = 1
    memo.bound()
    assert memo.entries == {"a": 1}
    memo.entries["b"] = 2
    memo.bound()
    assert memo.entries == {}


def test_a_memo_table_gives_back_each_row_it_stored_past_its_first_allocation():
    table: MemoTable[int] = MemoTable(1_000, ((2,), np.float64), ((), bool))
    rows = [table.append((float(i), -float(i)), i % 2 == 0) for i in range(300)]
    values, flags = table.take(rows[::-1])
    assert values[:, 0].tolist() == [float(i) for i in reversed(range(300))]
    assert flags.tolist() == [i % 2 == 0 for i in reversed(range(300))]


def test_a_bounded_memo_table_reuses_its_rows_from_the_first():
    table: MemoTable[int] = MemoTable(2, ((1,), np.int64))
    table.entries["a"], table.entries["b"] = table.append([7]), table.append([8])
    table.bound()
    assert table.entries == {}
    table.entries["c"] = table.append([9])
    assert table.entries["c"] == 0
    assert table.take([0])[0].tolist() == [[9]]
