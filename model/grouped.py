"""Every length group of a batch through the traced network in one call, its inputs packed in three flat tensors.

Why one call and flat tensors: the corrector runs the network on its own thread while the batch thread does the
language model's work (`Corrector.predict_batch`). torch 2.13 takes the GIL whenever its interpreter drops a tensor
that Python also holds (`TensorImpl::decref_pyobject`, seen with `py-spy dump --native`), and with another thread
busy in Python each take waits up to the switch interval (5 ms). Passed the nine inputs of each of ~5 groups, the
network took 330 ms a batch beside busy Python instead of 33 ms; passed three flat tensors whose views the graph
cuts itself (views made inside the graph have no Python object), 51 ms (docs/benchmarks.md, issue 21). The same
kernels on the same values: the same probabilities to the bit (tests/model/test_corrector.py).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
from torch import Tensor, nn

# The network's inputs by dtype, in the order they are packed (each group's arrays one after the other).
INTS = ("chars", "syl", "tone", "bnd", "cand_ids", "attn_mask")
FLOATS = ("pos_feats", "cand_feats")
BOOLS = ("cand_mask",)
log = logging.getLogger(__name__)


class Packed:
    """A batch's length groups as three flat tensors and one shape row per group: B, L, C, S, P, F."""

    def __init__(self, groups: list[dict[str, np.ndarray]]) -> None:
        self.shapes: list[list[int]] = []
        for g in groups:
            b, length, c, s = g["cand_ids"].shape
            self.shapes.append([b, length, c, s, g["pos_feats"].shape[-1], g["cand_feats"].shape[-1]])
        self.ints = torch.from_numpy(np.concatenate([g[k].ravel() for g in groups for k in INTS]))
        self.floats = torch.from_numpy(np.concatenate([g[k].ravel() for g in groups for k in FLOATS]))
        self.bools = torch.from_numpy(np.concatenate([g[k].ravel() for g in groups for k in BOOLS]))


class GroupedNet(nn.Module):
    """Cut each group's inputs out of the packed tensors and return its candidate probabilities [B, L, C]."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, ints: Tensor, floats: Tensor, bools: Tensor, shapes: list[list[int]]) -> list[Tensor]:
        out: list[Tensor] = []
        i, f, b = 0, 0, 0
        for s in shapes:
            n, c, cs = s[0] * s[1], s[2], s[2] * s[3]
            chars = ints[i : i + n].view(s[0], s[1])
            syl = ints[i + n : i + 2 * n].view(s[0], s[1])
            tone = ints[i + 2 * n : i + 3 * n].view(s[0], s[1])
            bnd = ints[i + 3 * n : i + 4 * n].view(s[0], s[1])
            cand_ids = ints[i + 4 * n : i + 4 * n + n * cs].view(s[0], s[1], c, s[3])
            attn_mask = ints[i + 4 * n + n * cs : i + 5 * n + n * cs].view(s[0], s[1])
            i += 5 * n + n * cs
            pos_feats = floats[f : f + n * s[4]].view(s[0], s[1], s[4])
            cand_feats = floats[f + n * s[4] : f + n * s[4] + n * c * s[5]].view(s[0], s[1], c, s[5])
            f += n * s[4] + n * c * s[5]
            cand_mask = bools[b : b + n * c].view(s[0], s[1], c)
            b += n * c
            logits = self.net(chars, syl, tone, bnd, pos_feats, cand_ids, cand_feats, cand_mask, attn_mask)
            out.append(torch.softmax(logits.float(), dim=-1))
        return out


def grouped(traced_net: nn.Module) -> torch.jit.ScriptModule | None:
    """Script a GroupedNet around an already traced network; None where torch cannot (each group is then a call)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is what torch 2.13 runs traced graphs with
            return torch.jit.script(GroupedNet(traced_net))
    except (RuntimeError, TypeError) as exc:
        log.warning("the length groups could not be scripted into one call (%s): one call each", exc)
        return None
