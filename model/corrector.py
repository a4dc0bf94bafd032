"""The corrector: n-best lists in, one corrected sentence each out.

Follows the house model shape: `setup()` loads the shipped weights and runs a warm-up batch, then each
call goes `batch` (featurize and pad) → `predict` (the network, under `torch.inference_mode()`) →
`unbatch` (pick a candidate per position, keep TOP1 unless the change is confident). CUDA (half
precision) when available, CPU otherwise, where the network's linear layers run in int8 (`cpu_precision`).

int8 on CPU is torch's dynamic quantization of `nn.Linear` (weights stored int8, each batch's activations
quantized on the fly; fbgemm kernels): the network's forward pass over a batch of 64 takes 40 ms instead of 62 on
the 2-core machine, the whole batch 80-87 ms instead of 110-120, and 64 clients get about 20 % more answers a
second from the served model (docs/benchmarks.md). The answers barely move: `python -m learn.evaluate --limit
3000` gave answer CERs of 2.954 / 4.097 / 8.422 % (test / reviews / decoded) against 2.948 / 4.083 / 8.436 % in
fp32, with the same sentences made worse (6 / 8 / 13). `cpu_precision="fp32"` keeps the network as trained.

Since issue 46 the network can run on CPU in ONNX Runtime (`cpu_runtime="onnx"`, model/runtime.py: exported at
set-up, int8 by ONNX Runtime's own dynamic quantization, the same scheme with other kernels; torch as above where it
cannot). Not the default: slower than torch's TorchScript int8 on the quiet 2-core machine (docs/benchmarks.md).
CUDA is torch's either way. int8 is kept there too: it is faster than its fp32, and on 3,000 lists of each simulated
set its answer CERs are within 0.007 points of torch int8's (2.948 / 4.090 / 8.434 % against 2.954 / 4.095 /
8.427 %), made worse 6 / 8 / 13 against 6 / 8 / 12, the extra list one that the network in fp32 (torch or ONNX
Runtime: the same figures) makes worse too; int8 weights per channel or on 7 bits
answered no better (docs/model.md, docs/bench/issue46/). The candidate features' two small projections stay fp32
(`model.network.FeatureProjection`, folded into the scores): 29 ms a forward pass of 64 lists instead of 34 on one
thread, the answer CERs on those 3,000 lists a set 2.957 / 4.090 / 8.436 % against 2.952 / 4.097 / 8.422 %, the same
6 / 8 / 13 made worse and 0 / 0 / 1 right TOP1 changed (docs/benchmarks.md, issue 46).
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
import logging
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

import compiled
from config import DEFAULT_LM_PATH, DEFAULT_WEIGHTS_DIR
from model.adaptation import Adaptation
from model.contract import check_features, check_masked_lm, sha256
from model.features import Example, Featurizer, Vocab, collate
from model.gate import Gate
from model.lm import LanguageModel, TaiwanLexicon, taiwan_lexicon_path
from model.masked_lm import MaskedLM
from model.network import CorrectorNet, NetConfig
from model.rerank import Reranker, RerankWeights
from model.runtime import OnnxNet, onnx_net, quantized
from model.weights_meta import DEFAULT_NAME, NETWORK_FILE, VOCAB_FILE, WeightsMeta
from preprocess.confusion import ConfusionSet
from preprocess.text import NBest, top1_answer

WARM_UP_LISTS = 256  # four full batches: about 1 s of start-up on 2 cores
NET_INPUTS = tuple(inspect.signature(CorrectorNet.forward).parameters)[1:]  # the forward's tensors, in order
log = logging.getLogger(__name__)


def choose(example: Example, probs: np.ndarray, threshold: float) -> str:
    """Rebuild the sentence: at each position the best candidate if it beats keep with p >= threshold; TOP1 where
    that would delete every character (a candidate may be a deletion, and an empty answer is none)."""
    out: list[str] = []
    for i, cands in enumerate(example.candidates):
        p = probs[i, : len(cands)]
        best = int(p.argmax())
        out.append(cands[best] if best != 0 and p[best] >= threshold else cands[0])
    return "".join(out) or example.top1


def resolve_device(device: str) -> torch.device:
    """Map auto / cpu / cuda to a torch device (auto: CUDA when present)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but CUDA is not available")
    return torch.device(device)


@dataclass
class Batch:
    examples: list[Example | None]
    groups: list[tuple[list[int], dict[str, torch.Tensor]]]  # item indices and their padded tensors


def length_groups(lengths: list[tuple[int, int]], max_waste: float = 0.25, min_group: int = 8) -> list[list[int]]:
    """Split (index, length) pairs into groups of similar length, so short inputs are not padded to long ones.

    Sorted by length, a group is closed when adding the next item would make more than `max_waste` of its
    padded tokens padding (groups of fewer than `min_group` items stay open: tiny matrices are slow too).
    """
    groups: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for index, n in sorted(lengths, key=lambda p: p[1]):
        if len(cur) >= min_group and (len(cur) + 1) * n > (1 + max_waste) * (total + n):
            groups.append(cur)
            cur, total = [], 0
        cur.append(index)
        total += n
    if cur:
        groups.append(cur)
    return groups


def traced(net: torch.nn.Module, example: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Return `net` traced by TorchScript on one example batch, or `net` itself where tracing fails.

    The traced graph runs the same aten kernels on the same tensors, so the same probabilities to the bit (checked
    on every length group of 9,000 evaluation lists and 600 single lists), without the Python of ~60 module calls per
    forward pass: 2.0 → 0.9 ms per list alone, 33 → 22 ms per batch of 64 on the 2-core machine (issue 21). Nothing in
    the network branches on its inputs' values (the attention mask is an additive one whatever the padding)."""
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # TracerWarnings about shapes read as Python ints: none steers a branch
            return torch.jit.trace(net, tuple(example[k] for k in NET_INPUTS), check_trace=False)
    except (RuntimeError, TypeError, ValueError) as exc:
        log.warning("the network could not be traced (%s): it runs eagerly", exc)
        return net


# What every worker's setup reads and parses the same way (pure Python objects, no threads, no device): read once
# in gunicorn's master by `preload`, before it forks, they are shared by every worker it starts, the first or one
# replacing a dead one, which then skips 0.34 s of Python on its loading thread (more under load, where that thread
# shares the GIL with the threads answering meanwhile). A vocabulary (and its confusion set) is known by its file's
# sha256: the same wherever it lies (`learn.adapt` copies the shipped one into every adapted folder), read once.
_SHARED: dict[tuple[str, str], Any] = {}
_PRELOADED: set[tuple[str, str]] = set()  # read by `preload`, in the master before the fork


def _shared(kind: str, key: str, build: Callable[[], Any]) -> Any:
    if (kind, key) not in _SHARED:
        _SHARED[kind, key] = build()
    return _SHARED[kind, key]


def _vocab_key(weights_dir: Path) -> str:
    return sha256(Path(weights_dir) / VOCAB_FILE)


def _vocab(weights_dir: Path) -> Vocab:
    return _shared("vocab", _vocab_key(weights_dir), lambda: Vocab.load(weights_dir / VOCAB_FILE))


def _confusion(weights_dir: Path) -> ConfusionSet:
    return _shared("confusion", _vocab_key(weights_dir), lambda: ConfusionSet(_vocab(weights_dir).counts))


def _lexicon() -> TaiwanLexicon:
    path = taiwan_lexicon_path()
    return _shared("lexicon", str(Path(path).resolve()), lambda: TaiwanLexicon.load(path))


def forget_shared(keep: Path) -> int:
    """Drop the vocabularies and confusion sets read for folders no longer served (after a swap, `hosting.host`), but
    `keep`'s and those gunicorn's master read before the fork: the master holds those, so dropping them here would
    free nothing (the pages this process touched are its own copies either way). Return how many were dropped."""
    kept = _vocab_key(keep)
    stale = [key for key in _SHARED if key[0] in ("vocab", "confusion") and key[1] != kept and key not in _PRELOADED]
    for key in stale:
        _SHARED.pop(key, None)
    return len(stale)


def preload(weights_dir: Path | None = None, with_lm: bool = True) -> None:
    """Read the vocabulary, its bigram model, its confusion set and the Taiwan lexicon now, for the workers a fork will
    start."""
    weights_dir = Path(weights_dir or DEFAULT_WEIGHTS_DIR)
    _vocab(weights_dir).bigram_lm()
    _confusion(weights_dir)
    if with_lm:
        _lexicon()
    _PRELOADED.update(_SHARED)


class Corrector:
    """Correct batches of n-best lists with the shipped network."""

    def __init__(self, weights_dir: Path | None = None, device: str = "auto", threads: int = 0,
                 lm_path: Path | None = DEFAULT_LM_PATH, stage: str = "full", cpu_precision: str = "int8",
                 cpu_runtime: str = "torch", masked_lm_dir: Path | None = None) -> None:
        self.weights_dir = Path(weights_dir or DEFAULT_WEIGHTS_DIR)
        # a team's masked LM (MLM_DIR): loaded only where the served stage weighs it (model.masked_lm)
        self.masked_lm_dir = Path(masked_lm_dir) if masked_lm_dir else None
        self.device_name = device
        self.threads = threads
        self.cpu_precision = cpu_precision  # "int8" or "fp32": how the network runs on CPU (module docstring)
        self.cpu_runtime = cpu_runtime  # "torch" or "onnx" (ONNX Runtime, torch where it cannot): what runs it on CPU
        self.lm_path = lm_path
        self.stage = stage  # "full" (network + LM), "lm" (LM over the n-best), "net" (the network alone)
        self.ready = False
        # filled by setup(), None until then
        self.meta: WeightsMeta | None = None
        self.device: torch.device | None = None
        self.vocab: Vocab | None = None
        self.featurizer: Featurizer | None = None
        self.threshold: float | None = None
        self.net: torch.nn.Module | OnnxNet | None = None
        self.dtype: torch.dtype | None = None
        self.n_parameters: int | None = None
        self.precision: str | None = None  # "fp16", "int8" or "fp32"
        self.runtime: str | None = None  # "torch" or "onnx": what runs the network
        self.lm: LanguageModel | None = None
        self.adaptation: Adaptation | None = None  # what learn.adapt learned, when the folder holds it
        self.reranker: Reranker | None = None
        self.masked_lm: MaskedLM | None = None

    def setup(self) -> None:
        """Load vocabulary, configuration and weights, then run a warm-up batch."""
        self.device = resolve_device(self.device_name)
        if self.threads:
            torch.set_num_threads(self.threads)
        self.meta = WeightsMeta.load(self.weights_dir)
        check_features(self.meta.features, source=f"the weights in {self.weights_dir}")
        self.vocab = _vocab(self.weights_dir)
        self.featurizer = Featurizer(self.vocab, _confusion(self.weights_dir))
        self.featurizer.fill_memos()
        self.threshold = float(self.meta.threshold)
        net = CorrectorNet(NetConfig(**dataclasses.asdict(self.meta.net)))
        state = load_file(str(self.weights_dir / NETWORK_FILE))
        net.load_state_dict({k: v.float() for k, v in state.items()})
        net.eval()
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.net = net.to(self.device, self.dtype)
        self.n_parameters = sum(p.numel() for p in net.parameters())
        self.precision = "fp16" if self.device.type == "cuda" else "fp32"
        self.runtime = "torch"
        if self.lm_path is not None:
            self.lm = LanguageModel(Path(self.lm_path), lexicon=_lexicon())
        if self.meta.adaptation is not None and self.lm is not None:
            self.adaptation = Adaptation.load(self.weights_dir, self.meta.adaptation.to_dict(), self.lm.to_simplified)
        self.reranker = self._reranker()
        warm = self._warm_up_lists()
        if self.device.type == "cpu":  # on CUDA the network runs in torch, as it was loaded
            groups = self.batch(warm[:64]).groups
            self.net = self._cpu_net(net, max(groups, key=lambda g: len(g[0]))[1])
        for start in range(0, len(warm), 64):
            self.predict_batch(warm[start : start + 64])
        self.ready = True

    def _cpu_net(self, net: torch.nn.Module, example: dict[str, torch.Tensor]) -> torch.nn.Module | OnnxNet:
        """The fp32 `net` as it runs on CPU: in ONNX Runtime (`cpu_runtime="onnx"`, model/runtime.py) where it can,
        else in torch (int8 by dynamic quantization for `cpu_precision="int8"`, then traced); sets `precision` and
        `runtime`."""
        int8 = self.cpu_precision == "int8"
        if self.cpu_runtime == "onnx":
            exported = onnx_net(net, example, NET_INPUTS, torch.get_num_threads(), int8)
            if exported is not None:
                self.runtime, self.precision = "onnx", self.cpu_precision
                return exported
        cpu = quantized(net) if int8 else net
        self.runtime, self.precision = "torch", "int8" if cpu is not net else "fp32"
        return traced(cpu, example)

    def _warm_up_lists(self) -> list[NBest]:
        """Lists of frequent Taiwan words, seeded: the first full batches after start-up otherwise run 3-4 times
        slower (featurization's first passes), long enough under load for requests to time out into TOP1."""
        warm = NBest(("喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去", "喂 您好 密碼 我 要 進去"))
        if self.lm is None:
            return [warm] * WARM_UP_LISTS
        logp = self.lm.lexicon.logp
        words = heapq.nlargest(20_000, logp, key=logp.__getitem__)
        rng = random.Random(0)
        lists = []
        for _ in range(WARM_UP_LISTS):
            top1 = rng.choices(words, k=rng.randint(3, 12))
            others = [[*top1[:k], rng.choice(words), *top1[k + 1 :]] for k in rng.sample(range(len(top1)), 3)]
            lists.append(NBest(tuple(" ".join(h) for h in (top1, *others))))
        return lists

    def _reranker(self) -> Reranker | None:
        """The second stage the weights' config describes for `stage`, or None for the network alone."""
        assert self.meta is not None  # set up first
        fitted = self.meta.rerank.get(self.stage)
        if self.stage == "net":
            return None
        if fitted is None:
            log.warning("the weights in %s have no fitted %r stage (python -m learn.tune --variant %s --write):"
                        " the network alone answers", self.weights_dir, self.stage, self.stage)
            return None
        if self.lm is None:
            raise ValueError(f"stage {self.stage!r} needs the language model, but no LM_PATH was given")
        gate = Gate.from_dict(fitted.gate) if fitted.gate is not None else None
        weights = RerankWeights.from_dict(fitted.weights)
        if weights.mlm:  # the model it was fitted with, or a one-line refusal (a swap to it fails: the old one serves)
            check_masked_lm(self.masked_lm_dir, self.meta.masked_lm, self.weights_dir)
            assert self.masked_lm_dir is not None and self.device is not None  # checked just above; set up first
            self.masked_lm = MaskedLM(self.masked_lm_dir, self.device, self.cpu_precision)
        return Reranker(self.lm, weights, self.adaptation, gate, self.masked_lm)

    def batch(self, items: list[NBest]) -> Batch:
        """Featurize, then pad by length groups; items whose TOP1 has no Han character skip the network."""
        examples = self.featurizer.featurize_batch(items)
        groups = length_groups([(i, len(e.top1)) for i, e in enumerate(examples) if e is not None])
        return Batch(examples, [(group, self._tensors([examples[i] for i in group])) for group in groups])

    def _tensors(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        arrays = collate(examples)
        arrays.pop("labels")
        tensors = {}
        for k, v in arrays.items():
            t = torch.from_numpy(v)
            if t.is_floating_point():
                t = t.to(self.dtype)
            tensors[k] = t.to(self.device, non_blocking=True)
        return tensors

    def predict(self, batch: Batch) -> dict[int, np.ndarray]:
        """Run the network on each length group: candidate probabilities [L, C] by item index."""
        probs: dict[int, np.ndarray] = {}
        with torch.inference_mode():
            for group, tensors in batch.groups:
                out = torch.softmax(self.net(**tensors).float(), dim=-1).cpu().numpy()
                probs.update(zip(group, out, strict=True))
        return probs

    def unbatch(self, items: list[NBest], batch: Batch, probs: dict[int, np.ndarray]) -> list[str]:
        """Turn probabilities back into one answer per item, in order: never empty.

        An item whose TOP1 has no Han character has no Example and is answered TOP1 as it is (the service never asks
        about one: it answers it itself, on its `no_han` path)."""
        asked = [i for i, example in enumerate(batch.examples) if example is not None]
        examples = [batch.examples[i] for i in asked]
        if self.reranker is None:
            answers = [choose(example, probs[i], self.threshold) for i, example in zip(asked, examples, strict=True)]
        else:  # the batch's lists together: a masked LM, when the stage weighs one, is asked once for all of them
            answers = self.reranker.choose_all(examples, [probs.get(i) if self.stage == "full" else None
                                                          for i in asked])
        out = dict(zip(asked, answers, strict=True))
        return [out[i] if i in out else top1_answer(item.sentences) for i, item in enumerate(items)]

    def predict_batch(self, items: list[NBest]) -> list[str]:
        """Correct a list of n-best lists: batch → predict → unbatch."""
        batch = self.batch(items)
        return self.unbatch(items, batch, self.predict(batch))

    def release(self) -> None:
        """Drop what `setup()` built, so that reference counting frees it at once; call it only when no batch runs
        on this corrector (`hosting.host` does, after another took its place).

        The featurizer's fast path holds a function of the featurizer, and a masked LM a hook bound to it: cycles that
        only a full collection would free, and the served objects are frozen (`hosting.loading.freeze_set_up`), which
        no collection frees. Emptying those parts' attributes breaks the cycles. Shared parts (the vocabulary, the
        Taiwan lexicon) are only let go of."""
        for part in (self.lm, self.featurizer, self.reranker, self.adaptation, self.masked_lm):
            if part is not None and hasattr(part, "__dict__"):
                vars(part).clear()
        self.ready = False
        self.lm = self.featurizer = self.reranker = self.adaptation = self.net = self.masked_lm = None

    @property
    def info(self) -> dict:
        """Describe the loaded model for `GET /`: name, version, size, settings and evaluation figures."""
        meta = self.meta
        return {
            "name": meta.name if meta is not None else DEFAULT_NAME,
            "version": meta.version if meta is not None else None,
            "device": str(self.device or self.device_name),
            "parameters": self.n_parameters if self.ready else None,
            "precision": self.precision if self.ready else None,
            "runtime": self.runtime if self.ready else None,
            "compiled": all(compiled.used().values()),  # the hot modules run compiled to C (compiled.py)
            "threshold": meta.threshold if meta is not None else None,
            "stage": self.stage if self.reranker is not None else "net",
            "language_model": str(self.lm.path) if self.lm is not None else None,
            "masked_lm": self.masked_lm.describe() if self.masked_lm is not None else None,
            "trained": meta.trained if meta is not None else None,
            "adapted": meta.adaptation.provenance if meta is not None and meta.adaptation is not None else None,
            "evaluation": meta.evaluation if meta is not None else None,
        }
