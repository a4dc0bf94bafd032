"""testing.answer_path: one answer's time cut into the corrector's steps, each list classed by what the model and its
abstain gate did (behaviour only; the figures are docs/architecture.md's)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from config import Config
from preprocess.text import NBest, top1_answer
from testing import answer_path
from tests.fakes import FakeCorrector


class FakeGate:
    """Lets a change through unless TOP1 holds 不."""


class SteppedReranker:
    """The second stage's steps the tool times: candidates, features and the abstain gate's verdict."""

    def __init__(self, gate: FakeGate | None) -> None:
        self.gate = gate

    def candidates(self, top1: str) -> list[str]:
        return [top1, "改" + top1]

    def rows(self, top1: str) -> list[float]:
        return [0.0, 1.0]

    def _gate_admits(self, top1: str) -> bool:
        return "不" not in top1


class SteppedCorrector(FakeCorrector):
    """A corrector with the real one's hooks: `predict_batch` is batch → predict → unbatch, and `unbatch` asks the
    second stage. It changes every TOP1 holding 查 (where the gate admits it), and keeps the others."""

    def __init__(self, gate: FakeGate | None = None) -> None:
        super().__init__()
        self.reranker = SteppedReranker(gate)

    def predict_batch(self, items: list[NBest]) -> list[str]:
        self.batches.append(list(items))
        batch = self.batch(items)
        return self.unbatch(items, batch, self.predict(batch))

    def batch(self, items: list[NBest]) -> list[str]:
        return [top1_answer(item.sentences) for item in items]

    def predict(self, batch: list[str]) -> list[float]:
        return [1.0 for _ in batch]

    def unbatch(self, items: list[NBest], batch: list[str], probs: list[float]) -> list[str]:
        out = []
        for top1 in batch:
            cands = self.reranker.candidates(top1)
            self.reranker.rows(top1)
            changes = "查" in top1
            if changes and self.reranker.gate is not None:
                changes = self.reranker._gate_admits(top1)
            out.append(cands[1] if changes else top1)
        return out


def _bodies(tops: list[str]) -> list[dict]:
    return [{"esun_uuid": f"u{k}", "esun_timestamp": 1, "sentence_list": [top], "retry": 2}
            for k, top in enumerate(tops)]


TOPS = ["我 要 查詢", "你 好", "我 不 查詢", "他 要 查帳", "好 的", "我 想 查尋", "謝謝", "我 不 查帳"]


MEASURE = answer_path.measure


def _measure(gate: FakeGate | None, config: Config) -> dict:
    built = SteppedCorrector(gate)
    patient = dataclasses.replace(config, judge_timeout_s=10.0, safety_margin_s=0.5)
    return MEASURE(Path("fake"), _bodies(TOPS * 2), patient, build=lambda _config, _folder: built)


def test_each_list_is_classed_by_what_the_model_and_its_gate_did(config):
    result = _measure(FakeGate(), config)

    assert result["gate"] and not result["adapted"]
    classes = [(r["way"], r["class"]) for r in result["rows"]]
    expected = ["changed, gate admits", "kept", "gate refuses", "changed, gate admits", "kept", "changed, gate admits",
                "kept", "gate refuses"]
    assert classes == [("in process", c) for c in expected] + [("served", c) for c in expected]


def test_the_steps_of_an_answer_add_up_to_the_models_time_and_served_ones_say_what_lies_outside_it(config):
    result = _measure(FakeGate(), config)

    for row in result["rows"]:
        assert set(answer_path.STEPS) <= set(row)
        if row["class"] == "kept":  # the gate is asked only where the stage would change TOP1
            assert row["gate"] == 0.0
        assert sum(row[step] for step in answer_path.STEPS) == pytest.approx(row["model"], abs=0.05)
        assert row["total"] >= row["model"]
        if row["way"] == "served":
            assert row["outside the model"] == pytest.approx(row["total"] - row["model"], abs=0.002)
    summary = {(s["way"], s["class"]): s["lists"] for s in result["summary"]}
    assert summary == {(w, c): n for w in ("in process", "served")
                       for c, n in (("changed, gate admits", 3), ("gate refuses", 2), ("kept", 3))}


def test_a_stage_without_a_gate_classes_a_change_as_changed_and_never_times_a_gate(config):
    result = _measure(None, config)

    assert not result["gate"]
    assert {r["class"] for r in result["rows"]} == {"changed", "kept"}
    assert all(r["gate"] == 0.0 for r in result["rows"])


def test_the_table_has_a_row_per_folder_way_and_class(config):
    lines = answer_path.table([_measure(FakeGate(), config)])

    assert lines[0].startswith("| folder | way | class | lists | batch | predict | candidates | features | gate |")
    assert len(lines) == 2 + 6 and all(line.startswith("| fake | ") for line in lines[2:])


def test_the_tool_prints_the_table_and_writes_the_json(tmp_path, monkeypatch, capsys, config):
    monkeypatch.setattr(answer_path, "measure", lambda folder, bodies, _config: _measure(FakeGate(), config))
    monkeypatch.setattr("testing.samples.simulated_bodies", lambda n, **_: _bodies(TOPS)[:1] * n)
    monkeypatch.setattr(sys, "argv", ["answer_path", "--lists", "4", "--out", str(tmp_path)])

    assert answer_path.main() == 0
    written = json.loads((tmp_path / "answer_path.json").read_text(encoding="utf-8"))
    assert written["lists"] == 4 and len(written["results"]) == 1
    assert "| fake | served | gate refuses | 2 |" in capsys.readouterr().out
