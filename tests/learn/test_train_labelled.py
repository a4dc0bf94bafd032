"""Fine-tuning the shipped corrector on labelled lists (`python -m learn.train --data FILE`), on a tiny file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from config import DEFAULT_WEIGHTS_DIR
from learn.data.labelled import Labelled, write_labelled
from learn.train import main
from model.corrector import Corrector
from preprocess.text import NBest

pytestmark = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]

# (truth, TOP1 with one character swapped for a sound-alike, a lower hypothesis holding the truth)
ROWS = [
    ("喂 你好 密碼 我 要 進去", "喂 你好 密碼 我 要 盡去"),
    ("我 想 查詢 信用卡 帳單", "我 想 查尋 信用卡 帳單"),
    ("請 幫 我 轉接 客服", "請 幫 我 轉接 課服"),
    ("我 的 卡片 不見 了", "我 的 卡片 不 件 了"),
    ("我 要 辦理 掛失", "我 要 辦裡 掛失"),
    ("這 個 月 的 利息 是 多少", "這 個 月 的 立息 是 多少"),
    ("我 想 申請 貸款", "我 想 身請 貸款"),
    ("請問 營業 時間 到 幾點", "請問 營業 時見 到 幾點"),
    ("我 要 修改 通訊 地址", "我 要 修改 通訊 地止"),
    ("今天 的 匯率 是 多少", "今天 的 會率 是 多少"),
    ("我 忘記 網路 銀行 的 密碼", "我 忘記 網路 銀航 的 密碼"),
    ("我 想 開 一 個 帳戶", "我 想 開 一 個 長戶"),
    ("信用卡 的 額度 可以 調高 嗎", "信用卡 的 額度 可以 條高 嗎"),
    ("我 要 繳 這 期 的 費用", "我 要 叫 這 期 的 費用"),
    ("轉帳 失敗 了 怎麼 辦", "轉帳 失敗 了 怎麼 半"),
    ("我 想 問 一下 保險 的 事情", "我 想 問 一下 保顯 的 事情"),
]


def _write_rows(path: Path) -> Path:
    items = [Labelled(f"row{n}", "".join(truth.split()), NBest((top1, truth, top1.replace(" ", "  "))))
             for n, (truth, top1) in enumerate(ROWS)]
    write_labelled(items, path)
    return path


def test_train_fine_tunes_shipped_weights_on_labelled_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = _write_rows(tmp_path / "labelled.jsonl")
    out = tmp_path / "weights"
    shipped = (DEFAULT_WEIGHTS_DIR / "model.safetensors").read_bytes()

    main(["--data", str(data), "--sim-ratio", "0", "--init", "shipped", "--steps", "3", "--batch-size", "8",
          "--warmup", "1", "--dev-share", "0.3", "--out", str(out), "--ckpt-dir", str(tmp_path / "ckpt")])

    printed = capsys.readouterr().out
    assert f"{data}: {len(ROWS)} labelled rows" in printed
    assert {p.name for p in out.iterdir()} == {"config.json", "vocab.json", "model.safetensors"}
    assert (DEFAULT_WEIGHTS_DIR / "model.safetensors").read_bytes() == shipped
    assert (out / "vocab.json").read_bytes() == (DEFAULT_WEIGHTS_DIR / "vocab.json").read_bytes()
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    made_of = meta["trained"]["data"]
    assert meta["trained"]["steps"] == 3
    assert made_of["labelled_train"] + made_of["labelled_dev"] == len(ROWS)
    assert made_of["labelled_dev"] > 0 and meta["trained"]["dev"] is not None
    before, after = load_file(str(DEFAULT_WEIGHTS_DIR / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k].float(), after[k].float()) for k in before)

    corrector = Corrector(out, device="cpu")
    corrector.setup()
    answers = corrector.predict_batch([NBest((top1, truth)) for truth, top1 in ROWS[:4]])
    assert len(answers) == 4 and all(answers)


def test_train_keeps_initial_threshold_without_dev_lists(tmp_path: Path):
    data = _write_rows(tmp_path / "labelled.jsonl")
    out = tmp_path / "weights"

    main(["--data", str(data), "--sim-ratio", "0", "--steps", "1", "--dev-share", "0", "--out", str(out),
          "--ckpt-dir", str(tmp_path / "ckpt")])

    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    shipped = json.loads((DEFAULT_WEIGHTS_DIR / "config.json").read_text(encoding="utf-8"))
    assert meta["threshold"] == shipped["threshold"]
    assert meta["trained"]["dev"] is None


def test_train_refuses_checkpoint_of_another_run(tmp_path: Path):
    data = _write_rows(tmp_path / "labelled.jsonl")
    args = ["--data", str(data), "--sim-ratio", "0", "--steps", "1", "--out", str(tmp_path / "weights"),
            "--ckpt-dir", str(tmp_path / "ckpt")]
    main(args)

    with pytest.raises(SystemExit, match="is another run's checkpoint"):
        main([*args, "--seed", "8"])


def test_train_reports_malformed_labelled_file_in_one_line(tmp_path: Path):
    data = _write_rows(tmp_path / "labelled.jsonl")
    with data.open("a", encoding="utf-8") as f:
        f.write('{"id": "bad", "ground_truth_sentence": "我要轉帳", "sentence_list": []}\n')
    out = tmp_path / "weights"

    done = subprocess.run([sys.executable, "-m", "learn.train", "--data", str(data), "--out", str(out),
                           "--ckpt-dir", str(tmp_path / "ckpt")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})

    assert done.returncode == 1
    assert done.stderr.strip() == (f"{data}: line {len(ROWS) + 1} (id 'bad'): sentence_list must be a non-empty "
                                   f"list of strings, got []")
    assert not out.exists()


def test_train_stopped_by_ctrl_c_says_so_in_one_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    """Ctrl-C during `make train` printed a KeyboardInterrupt traceback (issue 41); `make adapt` printed one line."""
    import learn.train

    def interrupted(settings: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(learn.train, "run", interrupted)
    with pytest.raises(SystemExit) as stopped:
        main(["--out", str(tmp_path / "out"), "--ckpt-dir", str(tmp_path / "ckpt")])

    assert stopped.value.code == 130
    err = capsys.readouterr().err
    assert err == (f"train: interrupted; {tmp_path / 'out'} was not written; rerun the same command to resume from "
                   f"the last checkpoint in {tmp_path / 'ckpt'}\n")
    assert not (tmp_path / "out").exists()


def test_rows_whose_truth_an_excluded_file_holds_are_left_out_of_training(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]):
    from learn.train_data import read_data

    data = _write_rows(tmp_path / "labelled.jsonl")
    # a test set holding two of the truths, one written with spaces and punctuation the judge does not score
    test_set = tmp_path / "test.jsonl"
    write_labelled([Labelled("t0", "喂，你好密碼我要進去。", NBest(("喂 你好",))),
                    Labelled("t1", "我想申請貸款", NBest(("我 想",)))], test_set)

    kept = read_data([data], exclude=(test_set,))

    assert len(kept) == len(ROWS) - 2
    assert {item.truth for item in kept}.isdisjoint({"喂你好密碼我要進去", "我想申請貸款"})
    assert "--exclude: 2 rows left out" in capsys.readouterr().out
    assert len(read_data([data])) == len(ROWS)
