"""model/runtime.py: the network exported to ONNX Runtime at set-up, and torch serving wherever it cannot."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from config import REPO_ROOT
from model import runtime
from model.corrector import NET_INPUTS, Corrector
from model.features import MAX_CANDIDATES, MAX_SEGMENT, N_CAND_FEATS, N_POS_FEATS
from model.network import CorrectorNet, NetConfig
from model.runtime import OnnxNet, onnx_net

pytest.importorskip("onnxruntime")


def small_net() -> CorrectorNet:
    torch.manual_seed(0)
    return CorrectorNet(NetConfig(n_chars=40, n_syllables=20, hidden=32, layers=1, heads=2, ffn=64)).eval()


def tensors(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs shaped as model.features.collate makes them, the last `length // 3` positions of the first row
    padding."""
    g = torch.Generator().manual_seed(seed)
    attn = torch.ones(batch, length, dtype=torch.int64)
    attn[0, length - length // 3 :] = 0
    cand_mask = torch.rand(batch, length, MAX_CANDIDATES, generator=g) < 0.5
    cand_mask[..., 0] = True
    return {
        "chars": torch.randint(1, 40, (batch, length), generator=g),
        "syl": torch.randint(1, 20, (batch, length), generator=g),
        "tone": torch.randint(0, 6, (batch, length), generator=g),
        "bnd": torch.randint(0, 5, (batch, length), generator=g),
        "pos_feats": torch.rand(batch, length, N_POS_FEATS, generator=g),
        "cand_ids": torch.randint(0, 40, (batch, length, MAX_CANDIDATES, MAX_SEGMENT), generator=g),
        "cand_feats": torch.rand(batch, length, MAX_CANDIDATES, N_CAND_FEATS, generator=g),
        "cand_mask": cand_mask,
        "attn_mask": attn,
    }


def test_the_exported_network_gives_torchs_logits_on_batches_of_other_sizes_and_lengths():
    net = small_net()
    exported = onnx_net(net, tensors(4, 7), NET_INPUTS, threads=1, int8=False)
    assert isinstance(exported, OnnxNet)
    for batch, length in ((1, 3), (4, 7), (9, 20)):
        example = tensors(batch, length, seed=batch)
        with torch.no_grad():
            expected = net(**example)
        got = exported(**example)
        assert got.shape == expected.shape == (batch, length, MAX_CANDIDATES)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_the_int8_network_picks_the_candidates_fp32_picks_on_nearly_every_position():
    net = small_net()
    exported = onnx_net(net, tensors(4, 7), NET_INPUTS, threads=1, int8=True)
    assert isinstance(exported, OnnxNet)
    example = tensors(16, 12, seed=3)
    with torch.no_grad():
        expected = net(**example).argmax(-1)
    same = (exported(**example).argmax(-1) == expected).float().mean().item()
    assert same >= 0.9


def test_without_onnxruntime_there_is_no_exported_network_and_one_log_line(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with caplog.at_level(logging.WARNING, logger="model.runtime"):
        assert onnx_net(small_net(), tensors(2, 5), NET_INPUTS, threads=1, int8=True) is None
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["ONNX Runtime is not available"]


@pytest.mark.parametrize("step", ["export", "session", "quantize_int8"])
def test_a_failed_export_step_gives_no_exported_network_and_one_log_line_without_a_traceback(step, monkeypatch,
                                                                                            caplog):
    def fail(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("broken\nsecond line")

    monkeypatch.setattr(runtime, step, fail)
    with caplog.at_level(logging.WARNING, logger="model.runtime"):
        assert onnx_net(small_net(), tensors(2, 5), NET_INPUTS, threads=1, int8=True) is None
    assert len(caplog.records) == 1
    assert "RuntimeError: broken)" in caplog.records[0].getMessage() and caplog.records[0].exc_info is None


def test_an_export_that_gives_other_logits_than_torch_is_not_used(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "MAX_LOGIT_DIFF", -1.0)  # no difference passes
    with caplog.at_level(logging.WARNING, logger="model.runtime"):
        assert onnx_net(small_net(), tensors(2, 5), NET_INPUTS, threads=1, int8=False) is None
    assert "other logits than torch's" in caplog.records[0].getMessage()


def test_the_quantizer_lines_stay_out_of_the_root_logger(caplog):
    with caplog.at_level(logging.INFO):
        assert onnx_net(small_net(), tensors(2, 5), NET_INPUTS, threads=1, int8=True) is not None
    assert not [r for r in caplog.records if "onnxruntime" in r.pathname]


@pytest.mark.real_model
def test_on_cpu_the_corrector_runs_the_network_in_onnx_runtime_and_answers_as_torch():
    onnx = Corrector(device="cpu", stage="net", cpu_runtime="onnx")
    torch_ = Corrector(device="cpu", stage="net", cpu_runtime="torch")
    onnx.setup()
    torch_.setup()
    assert (onnx.info["runtime"], torch_.info["runtime"]) == ("onnx", "torch")
    assert onnx.info["precision"] == torch_.info["precision"] == "int8"
    assert isinstance(onnx.net, OnnxNet)
    items = onnx._warm_up_lists()  # 256 lists of frequent Taiwan words
    same = sum(a == b for a, b in zip(onnx.predict_batch(items), torch_.predict_batch(items), strict=True))
    assert same >= 0.98 * len(items)  # two int8 schemes move only rare close calls (docs/model.md)


@pytest.mark.real_model
def test_where_the_export_fails_the_corrector_serves_with_torch(monkeypatch, caplog):
    def export(*_args: object) -> bytes:
        raise RuntimeError("no exporter")

    monkeypatch.setattr(runtime, "export", export)
    corrector = Corrector(device="cpu", stage="net", cpu_runtime="onnx")
    with caplog.at_level(logging.WARNING, logger="model.runtime"):
        corrector.setup()
    assert corrector.ready and corrector.info["runtime"] == "torch" and corrector.info["precision"] == "int8"
    assert isinstance(corrector.net, torch.jit.ScriptModule)
    assert len(caplog.records) == 1


@pytest.mark.real_model
def test_loading_the_model_on_onnx_runtime_prints_nothing_on_stderr():
    """Every stderr line of the service is JSON: neither the exporter, the quantizer nor the session may print."""
    code = "from model.corrector import Corrector; c = Corrector(device='cpu', cpu_runtime='onnx'); c.setup(); " \
           "assert c.runtime == 'onnx'"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and run.stderr == ""
