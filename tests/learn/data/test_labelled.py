"""Reading the competition's labelled n-best lists: both formats, the lenient fields, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from learn.data.labelled import Labelled, LabelledFormatError, read_labelled, split_dev, write_labelled
from preprocess.text import NBest

_MISSING = object()


def _row(item_id: Any = 1, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": item_id,
        "ground_truth_sentence": "喂 你好 密碼 我 要 進去",
        "sentence_list": ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"],
        "phoneme_sequence_list": ["w eI4 n i:3 x aU4 m i:4 m A:3 w O:3 j aU1 ts6 j ax n4 ts6_h y4"],
    }
    row.update(fields)
    return {k: v for k, v in row.items() if v is not _MISSING}


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(LabelledFormatError) as caught:
        read_labelled(path)
    return str(caught.value)


def test_read_labelled_reads_official_json_list_with_bom(tmp_path: Path):
    path = tmp_path / "train_all.json"
    rows = [_row(1), _row("a2", res_text=None)]
    path.write_bytes(b"\xef\xbb\xbf  \n" + json.dumps(rows, ensure_ascii=False, indent=1).encode())

    items = read_labelled(path)

    assert [i.id for i in items] == ["1", "a2"]
    assert items[0].truth == "喂你好密碼我要進去"
    assert items[0].nbest.sentences == ("喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去")
    assert items[0].nbest.phonemes == ("w eI4 n i:3 x aU4 m i:4 m A:3 w O:3 j aU1 ts6 j ax n4 ts6_h y4",)


def test_read_labelled_reads_jsonl_skipping_blank_lines(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n" + json.dumps(_row(1)) + "\r\n\n" + json.dumps(_row(2)) + "\n", encoding="utf-8")

    assert [i.id for i in read_labelled(path)] == ["1", "2"]


def test_read_labelled_accepts_missing_null_short_phonemes_and_keeps_every_hypothesis(tmp_path: Path):
    eleven = [f"喂 第{n}" for n in range(11)]
    path = _jsonl(tmp_path / "rows.jsonl", [
        _row(1, phoneme_sequence_list=_MISSING),
        _row(2, phoneme_sequence_list=None),
        _row(3, phoneme_sequence_list=[], sentence_list=eleven),
    ])

    items = read_labelled(path)

    assert [i.nbest.phonemes for i in items] == [(), (), ()]
    assert len(items[2].nbest.sentences) == 11


def test_write_labelled_round_trips_through_read_labelled(tmp_path: Path):
    items = [Labelled("q1", "今天天氣很好", NBest(("今天 天氣 很 好", "今天 天氣 狠 好"), ("ts6 i: n1",))),
             Labelled("q2", "我要轉接客服", NBest(("我 要 轉接 客服",)))]
    path = tmp_path / "rows.jsonl"

    write_labelled(items, path)

    assert read_labelled(path) == items


@pytest.mark.parametrize(("row", "expected"), [
    (["not", "an", "object"], "line 2: a row must be a JSON object"),
    (_row(_MISSING), "line 2: id must be a non-empty string or an integer, got no such key"),
    (_row(1.5), "line 2: id must be a non-empty string or an integer, got 1.5"),
    (_row(True), "line 2: id must be a non-empty string or an integer, got true"),
    (_row("q", ground_truth_sentence=_MISSING), "line 2 (id 'q'): ground_truth_sentence must be a non-blank string"),
    (_row("q", ground_truth_sentence="  "), "line 2 (id 'q'): ground_truth_sentence must be a non-blank string"),
    (_row("q", sentence_list=_MISSING), "line 2 (id 'q'): sentence_list must be a non-empty list of strings"),
    (_row("q", sentence_list=[]), "line 2 (id 'q'): sentence_list must be a non-empty list of strings, got []"),
    (_row("q", sentence_list="喂 你好"), "line 2 (id 'q'): sentence_list must be a non-empty list of strings"),
    (_row("q", sentence_list=["喂", 3]), "line 2 (id 'q'): sentence_list must be a non-empty list of strings"),
    (_row("q", phoneme_sequence_list="w eI4"), "line 2 (id 'q'): phoneme_sequence_list must be a list of strings"),
    (_row("q", phoneme_sequence_list=[None]), "line 2 (id 'q'): phoneme_sequence_list must be a list of strings"),
])
def test_read_labelled_names_file_line_and_id_of_malformed_jsonl_row(tmp_path: Path, row: Any, expected: str):
    path = _jsonl(tmp_path / "rows.jsonl", [_row("ok"), row, _row("never read")])

    assert _error(path).startswith(f"{path}: {expected}")


def test_read_labelled_names_index_of_malformed_json_row(tmp_path: Path):
    path = tmp_path / "train_all.json"
    path.write_text(json.dumps([_row(0), _row(1), _row(2, sentence_list=[])]), encoding="utf-8")

    assert _error(path).startswith(f"{path}: index 2 (id '2'): sentence_list must be a non-empty list of strings")


def test_read_labelled_refuses_duplicate_ids_naming_both_rows(tmp_path: Path):
    path = _jsonl(tmp_path / "rows.jsonl", [_row(7), _row(8), _row("7")])

    assert _error(path) == f"{path}: line 3 (id '7'): duplicate id, first at line 1"


def test_read_labelled_names_line_of_invalid_json(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row(1)) + "\n{\"id\": 2,\n", encoding="utf-8")

    assert _error(path).startswith(f"{path}: line 2: not valid JSON")


@pytest.mark.parametrize(("text", "expected"), [
    ("", "no rows"), ("  \n\n", "no rows"), ("[]", "no rows"),
    ('[{"id": 1},', "not valid JSON at line 1"),
    ('{"rows": []}', "line 1: id must be"),
])
def test_read_labelled_refuses_empty_or_broken_files(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "rows.json"
    path.write_text(text, encoding="utf-8")

    assert expected in _error(path)


def test_read_labelled_refuses_non_utf8(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(json.dumps(_row(1), ensure_ascii=False).encode("big5"))

    assert "not UTF-8" in _error(path)


def test_split_dev_is_stable_and_near_the_share():
    items = [Labelled(str(n), "好", NBest(("好",))) for n in range(2000)]

    train, dev = split_dev(items, 0.1)

    assert 150 < len(dev) < 250
    assert len(train) + len(dev) == len(items)
    assert split_dev(list(reversed(items)), 0.1)[1] == list(reversed(dev))
    assert split_dev(items, 0.0) == (items, [])


def test_read_labelled_lenient_names_and_counts_malformed_rows(tmp_path):
    from learn.data.labelled import read_labelled_lenient

    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "ground_truth_sentence": "你好", "sentence_list": ["你 好"]}\n'
                    'not json\n'
                    '{"id": "b", "sentence_list": ["你 好"]}\n'
                    '{"id": "a", "ground_truth_sentence": "你好", "sentence_list": ["你 好"]}\n', encoding="utf-8")
    read = read_labelled_lenient(path)
    assert [it.id for it in read.items] == ["a"]
    assert len(read.malformed) == 3
    assert "line 2: not valid JSON" in read.malformed[0]
    assert "line 3 (id 'b'): ground_truth_sentence" in read.malformed[1]
    assert "duplicate id" in read.malformed[2]


def test_split_three_is_seeded_by_id_and_disjoint():
    from learn.data.labelled import Labelled, split_three
    from preprocess.text import NBest

    items = [Labelled(str(k), "你好", NBest(("你 好",))) for k in range(1000)]
    split = split_three(items, 0.15, 0.15, seed=7)
    again = split_three(list(reversed(items)), 0.15, 0.15, seed=7)
    assert {it.id for it in split.test} == {it.id for it in again.test}
    assert sum(split.sizes().values()) == 1000 and 100 < len(split.dev) < 200 and 100 < len(split.test) < 200
    assert not {it.id for it in split.train} & {it.id for it in split.test}
    assert {it.id for it in split_three(items, 0.15, 0.15, seed=8).test} != {it.id for it in split.test}
