"""learn.evaluate: the CER figures and labelled files (a live service is scored by testing.judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learn.data.labelled import Labelled, write_labelled
from learn.evaluate import cer_score, main
from preprocess.text import NBest

LISTS = [
    # (truth, hypotheses): TOP1 right; TOP1 wrong, oracle right; TOP1 wrong and no hypothesis right
    ("我要進去", ("我 要 進去", "我 哇 進去")),
    ("股價上漲", ("故價 上漲", "股價 上漲")),
    ("匯率下跌", ("會綠 下跌", "會率 下跌")),
]


def _labelled(path: Path) -> Path:
    write_labelled([Labelled(f"q{k}", t, NBest(h)) for k, (t, h) in enumerate(LISTS)], path)
    return path


def test_cer_score_counts_top1_oracle_answer_and_the_gap_closed():
    nbests = [NBest(h) for _, h in LISTS]
    truths = [t for t, _ in LISTS]
    score = cer_score(nbests, truths, ["我要進去", "股價上漲", "會綠下跌"])
    assert score.top1_cer == pytest.approx(3 / 12)  # 故, 會, 綠
    assert score.oracle_cer == pytest.approx(1 / 12)  # only 綠 is beyond the list
    assert score.answer_cer == pytest.approx(2 / 12)
    assert score.gap_closed == pytest.approx(0.5)
    assert (score.made_better, score.made_worse, score.top1_right, score.top1_right_changed) == (1, 0, 1, 0)


def test_cer_score_counts_a_changed_right_top1_as_made_worse():
    score = cer_score([NBest(LISTS[0][1])], [LISTS[0][0]], ["我哇進去"])
    assert (score.made_worse, score.top1_right_changed, score.top1_right_changed_share) == (1, 1, 1.0)


@pytest.mark.real_model
def test_evaluate_names_and_skips_a_malformed_row_and_scores_the_rest(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "ground_truth_sentence": "好", "sentence_list": ["好"]}\n{"id": 2}\n',
                    encoding="utf-8")
    assert main(["--data", str(path), "--stage", "lm", "--json"]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("skipped, malformed: ") and "bad.jsonl" in err and "line 2" in err
    assert json.loads(captured.out)["lm"]["bad.jsonl"]["sentences"] == 1


def test_evaluate_names_a_missing_or_incomplete_weights_folder_in_one_line(tmp_path, capsys):
    data = tmp_path / "one.jsonl"
    data.write_text('{"id": 1, "ground_truth_sentence": "好", "sentence_list": ["好"]}\n', encoding="utf-8")
    assert main(["--data", str(data), "--weights", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("--weights must name an existing weights folder, got "
                                                    f"{str(tmp_path / 'nowhere')!r}")
    (tmp_path / "half").mkdir()
    assert main(["--data", str(data), "--weights", str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is incomplete: config.json, vocab.json, model.safetensors missing" in err


@pytest.mark.real_model
def test_evaluate_scores_a_labelled_file_with_each_stage(tmp_path, capsys):
    assert main(["--data", str(_labelled(tmp_path / "set.jsonl")), "--stage", "all", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert set(results) >= {"net", "lm", "full"}
    for stage in ("net", "lm", "full"):
        figures = results[stage]["set.jsonl"]
        assert figures["sentences"] == 3 and figures["top1_right_changed"] == 0
        assert figures["ms_per_batch_64"] > 0


def test_cer_score_has_no_gap_to_close_when_the_list_holds_top1_alone():
    """Regression: a TOP1-alone file (oracle = TOP1) printed a gap closed of 4000 %."""
    from learn.evaluate import table

    score = cer_score([NBest(("我 要 去",))], ["我要趣"], ["我要趣"])
    assert score.gap_closed is None
    assert "| gap_closed | n/a |" in table({"top1-alone": {"gap_closed": None}})


class _Recorder:
    """A corrector that answers every list it is asked with "asked", and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[NBest] = []

    def predict_batch(self, items: list[NBest]) -> list[str]:
        self.asked += items
        return ["asked"] * len(items)


def test_a_top1_longer_than_the_service_takes_is_answered_as_itself_without_the_model():
    from learn.evaluate import served_answers

    long_top1 = " ".join(["股價"] * 23)  # 46 characters besides spaces
    lists = [NBest(("今天 股價",)), NBest((long_top1, "今天 股價")), NBest(("明天 故價",))]
    corrector = _Recorder()
    assert served_answers(corrector, lists, 45) == ["asked", long_top1.replace(" ", ""), "asked"]
    assert corrector.asked == [lists[0], lists[2]]


def test_two_files_of_one_name_get_a_column_each():
    from learn.evaluate import LabelledSet, distinct_names

    sets = [LabelledSet("nbest_test.jsonl", [], []), LabelledSet("top1.jsonl", [], []),
            LabelledSet("nbest_test.jsonl", [], [])]
    assert [s.name for s in distinct_names(sets)] == ["nbest_test.jsonl (1)", "top1.jsonl", "nbest_test.jsonl (2)"]
