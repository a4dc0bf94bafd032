"""Training the network on featurized examples (`fit`: length-bucketed batches, AdamW with linear warm-up and cosine
decay, a checkpoint every `ckpt_every` steps that only the same run resumes) and its probabilities on dev examples
(`dev_probs`). `learn.train` and `learn.adapt` call them.
"""

from __future__ import annotations

import math
import random
import sys
import time
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from learn.train_settings import TrainSettings
from model.features import Example, collate
from model.network import CorrectorNet

TENSOR_KEYS = ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask", "attn_mask")


def batches(examples: list[Example], size: int, rng: random.Random) -> list[list[int]]:
    """Group indices of similar length into batches, in random order."""
    idx = list(range(len(examples)))
    rng.shuffle(idx)
    out: list[list[int]] = []
    chunk = size * 50
    for s in range(0, len(idx), chunk):
        part = sorted(idx[s : s + chunk], key=lambda i: len(examples[i].top1))
        out += [part[j : j + size] for j in range(0, len(part), size)]
    rng.shuffle(out)
    return out


def to_tensors(examples: list[Example], device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    arrays = collate(examples)
    labels = torch.from_numpy(arrays.pop("labels")).to(device)
    return {k: torch.from_numpy(arrays[k]).to(device) for k in TENSOR_KEYS}, labels


@torch.inference_mode()
def dev_probs(net: CorrectorNet, examples: list[Example], device: torch.device) -> list[np.ndarray]:
    net.eval()
    out: list[np.ndarray] = []
    for s in range(0, len(examples), 128):
        chunk = examples[s : s + 128]
        tensors, _ = to_tensors(chunk, device)
        probs = torch.softmax(net(**tensors).float(), -1).cpu().numpy()
        out += [probs[b] for b in range(len(chunk))]
    net.train()
    return out


def run_id(settings: TrainSettings) -> dict[str, Any] | None:
    """Name what a checkpoint was trained on (None for today's default run, whose checkpoints carry no name)."""
    if not settings.data and settings.init == "scratch":
        return None
    return {"data": [str(p.resolve()) for p in settings.data], "init": settings.init, "sim_ratio": settings.sim_ratio,
            "dev_share": settings.dev_share, "seed": settings.seed,
            "init_from": str(settings.init_from.resolve()) if settings.init == "shipped" else None}


def learning_rate(settings: TrainSettings, step: int, total: int, elapsed_s: float) -> float:
    """The rate at `step` of `total`: a linear warm-up, then a cosine decay over the steps; a run whose pace so far
    would take it past --max-minutes decays over the time limit instead, so that it still ends annealed (a run well
    inside its limit never reads the clock: the same run, the same rates)."""
    lr_max = settings.learning_rate
    if step < settings.warmup:
        return lr_max * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, total - settings.warmup)
    limit_s = settings.max_minutes * 60
    if step and elapsed_s / step * total > limit_s:
        progress = max(progress, elapsed_s / limit_s)
    return lr_max * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def fit(net: CorrectorNet, train: list[Example], settings: TrainSettings, device: torch.device) -> int:
    """Train net on the examples (resuming from --ckpt-dir/last.pt of the same run); return the steps done."""
    lr_max = settings.learning_rate
    opt = torch.optim.AdamW(net.parameters(), lr=lr_max, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total = settings.steps or int(settings.epochs * steps_per_epoch)

    step = 0
    elapsed_before = 0.0
    settings.ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = settings.ckpt_dir / "last.pt"
    this_run = run_id(settings)
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        if state.get("run") != this_run:
            raise SystemExit(f"{ckpt} is another run's checkpoint ({state.get('run') or 'the default run'}): "
                             f"remove it or pass another --ckpt-dir")
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        elapsed_before = state.get("elapsed_s", 0.0)
        print(f"resumed from {ckpt} at step {step}/{total}")

    started = time.monotonic() - elapsed_before
    # dropout draws from torch's generator: seeded here (by the step a resumed run starts from), the same data and
    # settings give the same network, run after run, whoever called fit
    torch.manual_seed(settings.seed * 1000 + step)
    net.train()
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    bar = tqdm(total=total, initial=step, desc="train", mininterval=10,
               disable=not sys.stderr.isatty())  # a log gets no \r lines
    ema = None
    while step < total:
        epoch = step // steps_per_epoch
        order = batches(train, settings.batch_size, random.Random(settings.seed * 1000 + epoch))
        for b in order[step % steps_per_epoch :]:
            tensors, labels = to_tensors([train[i] for i in b], device)
            logits = net(**tensors)
            loss = loss_fn(logits.flatten(0, 1), labels.flatten())
            lr = learning_rate(settings, step, total, time.monotonic() - started)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            step += 1
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.4f}", lr=f"{lr:.2e}")
            out_of_time = time.monotonic() - started > settings.max_minutes * 60
            if step % settings.ckpt_every == 0 or step >= total or out_of_time:
                saved = {"net": net.state_dict(), "opt": opt.state_dict(), "step": step,
                         "elapsed_s": time.monotonic() - started}
                if this_run is not None:
                    saved["run"] = this_run
                torch.save(saved, ckpt)
            if step >= total or out_of_time:
                break
        if time.monotonic() - started > settings.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes reached")
            break
    bar.close()
    return step
