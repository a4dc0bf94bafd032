"""What runs a module on CPU: the network in ONNX Runtime (`onnx_net`), and torch's int8 of any module's linear
layers (`quantized`: the network's in torch, and a team's masked LM's, `model.masked_lm`).

`onnx_net(net, example, threads, int8)` exports the fp32 network (`model.network.CorrectorNet`) with torch's
TorchScript-based ONNX exporter on one example batch (batch and length dynamic; every other dimension is fixed by
`model.features.collate`), checks that ONNX Runtime's logits on that batch are torch's to within `MAX_LOGIT_DIFF`,
then, for `int8`, quantizes its MatMuls with `onnxruntime.quantization.quantize_dynamic` (int8 weights, each batch's
activations quantized on the fly: the same scheme as torch's `quantize_dynamic`, other kernels) and opens an
`InferenceSession` with the intra-op threads torch has. About 2 s of set-up on the 2-core machine (2.2 s in int8,
against 1.2 s for torch's quantization and trace); nothing is written into the weights folder, so any folder
`learn.train` or `learn.adapt` writes serves through it.

Not the default (`CPU_RUNTIME=torch` is): on the 2-core machine, quiet enough to measure, its forward pass of a
batch of 64 took 1.2-2x torch's int8 TorchScript one (the attention stays unfused here), while under CPU contention
from other processes torch's collapsed to over a second and this one did not (docs/benchmarks.md, "Issue 46"). Its
answers against torch's on 3,000 lists of each simulated set are in docs/model.md.

Where it cannot serve (onnxruntime or onnx not installed, an export, check or session failure) it returns None
after one log line, and torch serves as before.
"""

from __future__ import annotations

import io
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MAX_LOGIT_DIFF = 1e-3  # fp32 ONNX Runtime vs fp32 torch on the example batch: the same operations, rounding apart
OPSET = 17


class OnnxNet:
    """The exported network in an ONNX Runtime session: `net(**tensors)` gives the logits as a torch tensor, as the
    torch module does (CPU tensors in, a CPU tensor out)."""

    def __init__(self, session: Any, inputs: tuple[str, ...]) -> None:
        self.session = session
        self.inputs = inputs

    def __call__(self, **tensors: torch.Tensor) -> torch.Tensor:
        feeds = {name: tensors[name].numpy() for name in self.inputs}
        return torch.from_numpy(self.session.run(None, feeds)[0])


def export(net: torch.nn.Module, example: dict[str, torch.Tensor], inputs: tuple[str, ...]) -> bytes:
    """The fp32 network as an ONNX model (bytes), traced on `example`, batch and length dynamic."""
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings (shapes read as ints) and the exporter's deprecation notice
        torch.onnx.export(net, tuple(example[name] for name in inputs), buffer, input_names=list(inputs),
                          output_names=["logits"], dynamic_axes={name: {0: "batch", 1: "length"} for name in inputs},
                          opset_version=OPSET, dynamo=False)
    return buffer.getvalue()


def quantize_int8(model: bytes) -> bytes:
    """`model` with its MatMuls' weights in int8 (ONNX Runtime's dynamic quantization)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    root.addFilter(_quantizer_lines)  # it logs a line per tensor on the root logger itself
    try:
        with tempfile.TemporaryDirectory(prefix="corrector-onnx-") as tmp:  # its API reads and writes files
            fp32, int8 = Path(tmp) / "net.onnx", Path(tmp) / "net.int8.onnx"
            fp32.write_bytes(model)
            quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
            return int8.read_bytes()
    finally:
        root.removeFilter(_quantizer_lines)


def _quantizer_lines(record: logging.LogRecord) -> bool:
    """False for the lines onnxruntime.quantization logs on the root logger (a logger's filter sees only the lines
    logged on it, not those of the app's loggers)."""
    return "onnxruntime" not in record.pathname


def session(model: bytes, threads: int) -> Any:
    """An ONNX Runtime CPU session on `model`: `threads` intra-op threads, all graph optimizations."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Its threads sleep between runs instead of spinning: on 2 cores a spinning pool took the CPU the next batch's
    # featurization needed (a batch of 64: 226 ms spinning, 118 ms not, in one process).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings go to stderr in its own format
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def onnx_net(net: torch.nn.Module, example: dict[str, torch.Tensor], inputs: tuple[str, ...], threads: int,
             int8: bool) -> OnnxNet | None:
    """`net` (fp32, on CPU, in eval mode) exported into an ONNX Runtime session, or None, after one log line, where
    that cannot be done (torch then serves)."""
    try:
        import onnx  # noqa: F401  (the exporter needs it)
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        log.warning("ONNX Runtime is not available (%s): torch runs the network", exc)
        return None
    try:
        model = export(net, example, inputs)
        exported = OnnxNet(session(model, threads), inputs)
        with torch.no_grad():
            expected = net(**example).float()
        diff = float((exported(**example) - expected).abs().max())
        if not diff <= MAX_LOGIT_DIFF:  # NaN included
            log.warning("the network exported to ONNX gives other logits than torch's (max difference %.3g):"
                        " torch runs the network", diff)
            return None
        return OnnxNet(session(quantize_int8(model), threads), inputs) if int8 else exported
    except Exception as exc:  # any failure of export, quantization or session: torch serves
        log.warning("the network could not be run by ONNX Runtime (%s: %s): torch runs it",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None


def quantized(net: torch.nn.Module) -> torch.nn.Module:
    """Return `net` with its linear layers in int8 (dynamic quantization), or `net` itself where torch cannot."""
    try:
        with warnings.catch_warnings():
            # torch announces that this API moves to torchao; it is what torch itself ships today.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            return torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)  # a new module
    except (AttributeError, RuntimeError) as exc:  # a torch without it, or without a quantized engine here
        log.warning("int8 on CPU is not available (%s): the network runs in fp32", exc)
        return net
