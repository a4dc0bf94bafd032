"""Train the corrector from scratch: `python -m model.train`.

Recipe (every setting is a flag; the defaults are the shipped model's):
1. build the corpus if missing (`preprocess.corpus`), the vocabulary from the training split;
2. simulate `--variants` n-best lists per training sentence: the first with the default recogniser, the
   others with rates drawn around it, so the network does not learn one simulator's exact habits;
3. train with AdamW, linear warm-up and cosine decay, length-bucketed batches, checkpointing every
   `--ckpt-every` steps to `--ckpt-dir/last.pt` (rerunning the command resumes from it);
4. choose the change threshold on the dev split for precision (largest CER gain with at most 0.5 % of
   sentences made worse), and write `model.safetensors`, `vocab.json`, `config.json` to `--out`.
Seeded; uses CUDA when present.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from model.corrector import WEIGHTS_DIR, choose
from model.features import Example, Featurizer, Vocab, collate
from model.network import CorrectorNet, NetConfig
from preprocess.simulate import DEFAULT, SimConfig, Simulator, load_simulator
from preprocess.text import strip_spaces

TENSOR_KEYS = ("chars", "syl", "tone", "bnd", "pos_feats", "cand_ids", "cand_feats", "cand_mask", "attn_mask")


def jittered(rng: random.Random) -> SimConfig:
    """Draw a recogniser configuration around the default one."""
    return replace(
        DEFAULT,
        p_uncertain=rng.uniform(0.25, 0.45),
        p_top1_wrong=rng.uniform(0.3, 0.5),
        p_certain_error=rng.uniform(0.005, 0.03),
        p_filler=rng.uniform(0.0, 0.05),
        mix=tuple(m * rng.uniform(0.6, 1.4) for m in DEFAULT.mix),
        score_spread=rng.uniform(0.7, 1.5),
    )


def read_split(corpus: Path, name: str) -> list[str]:
    return [s for s in (corpus / f"{name}.txt").read_text(encoding="utf-8").split("\n") if s]


def make_examples(sim: Simulator, feat: Featurizer, sentences: list[str], seed: int, variants: int,
                  desc: str) -> list[Example]:
    """Simulate and featurize `variants` n-best lists per sentence."""
    rng = random.Random(seed)
    base = sim.config
    out: list[Example] = []
    for v in range(variants):
        sim.config = base if v == 0 else jittered(rng)
        for sent in tqdm(sentences, desc=f"{desc} {v + 1}/{variants}", mininterval=5):
            if v > 0 and rng.random() < 0.3:
                sim.config = jittered(rng)
            ex = feat.featurize(sim.simulate(sent, rng), strip_spaces(sent))
            if ex is not None:
                out.append(ex)
    sim.config = base
    return out


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


def pick_threshold(examples: list[Example], probs: list[np.ndarray], truths: list[str],
                   max_worse: float = 0.005, max_right_changed: float = 0.005) -> tuple[float, dict]:
    """Choose the lowest-CER change threshold that stays precise on dev.

    Precision first: at most `max_worse` of the sentences made worse than TOP1, and at most
    `max_right_changed` of the sentences whose TOP1 was right changed at all.
    """
    from rapidfuzz.distance import Levenshtein

    total = sum(len(t) for t in truths)
    base = [Levenshtein.distance(e.top1, t) for e, t in zip(examples, truths, strict=True)]
    n_right = max(1, sum(b == 0 for b in base))
    best = (1.01, {"cer": sum(base) / total, "worse": 0.0, "right_changed": 0.0, "top1_cer": sum(base) / total})
    for th in np.arange(0.30, 1.0, 0.01):
        outs = [choose(e, p, th) for e, p in zip(examples, probs, strict=True)]
        errs = [Levenshtein.distance(o, t) for o, t in zip(outs, truths, strict=True)]
        worse = sum(a > b for a, b in zip(errs, base, strict=True)) / len(truths)
        right_changed = sum(b == 0 and o != e.top1 for o, b, e in zip(outs, base, examples, strict=True)) / n_right
        cer = sum(errs) / total
        if worse <= max_worse and right_changed <= max_right_changed and cer < best[1]["cer"]:
            best = (round(float(th), 2), {"cer": cer, "worse": worse, "right_changed": right_changed,
                                          "top1_cer": sum(base) / total})
    return best


def tune(weights: Path, corpus: Path, n_dev: int, seed: int) -> tuple[float, dict]:
    """Re-choose the threshold of saved weights on the dev split and store it in their config.json."""
    from model.corrector import Corrector

    corrector = Corrector(weights, device="cpu")
    corrector.setup()
    sim = load_simulator(corpus)
    dev_sents = read_split(corpus, "dev")[:n_dev]
    dev = make_examples(sim, corrector.featurizer, dev_sents, seed + 1, 1, "dev")
    threshold, figures = pick_threshold(dev, dev_probs(corrector.net, dev, corrector.device),
                                        [strip_spaces(s) for s in dev_sents])
    cfg_path = weights / "config.json"
    meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    meta["threshold"] = threshold
    meta.setdefault("trained", {})["dev"] = figures
    cfg_path.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    return threshold, figures


def main() -> None:
    ap = argparse.ArgumentParser(description="Train the n-best corrector from scratch.")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    ap.add_argument("--ckpt-dir", type=Path, default=Path("checkpoints"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--max-minutes", type=float, default=60.0, help="stop training after this long")
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--dev-sentences", type=int, default=3000)
    ap.add_argument("--train-sentences", type=int, default=0, help="use only the first N (0 = all)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--tune-only", action="store_true",
                    help="only re-choose the change threshold of the weights in --out on the dev split")
    args = ap.parse_args()
    if args.tune_only:
        threshold, figures = tune(args.out, args.corpus, args.dev_sentences, args.seed)
        print(f"threshold {threshold:.2f} on dev: {json.dumps(figures)}")
        return

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not (args.corpus / "train.txt").exists():
        from preprocess.corpus import build, write

        write(build(), args.corpus)
    sim = load_simulator(args.corpus)
    train_sents = read_split(args.corpus, "train")[: args.train_sentences or None]
    vocab = Vocab.from_sentences(read_split(args.corpus, "train"))
    feat = Featurizer(vocab)
    train = make_examples(sim, feat, train_sents, args.seed, args.variants, "train")
    dev_sents = read_split(args.corpus, "dev")[: args.dev_sentences]
    dev = make_examples(sim, feat, dev_sents, args.seed + 1, 1, "dev")
    dev_truth = [strip_spaces(s) for s in dev_sents]

    net_cfg = NetConfig(n_chars=len(vocab.chars), n_syllables=len(vocab.syllables), hidden=args.hidden,
                        layers=args.layers, heads=args.hidden // 64, ffn=args.hidden * 4)
    net = CorrectorNet(net_cfg).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = int(args.epochs * steps_per_epoch)

    def lr_at(step: int, elapsed_s: float) -> float:
        # cosine decay over steps or over the time limit, whichever runs out first, so a run cut by
        # --max-minutes still ends annealed
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = max((step - args.warmup) / max(1, total - args.warmup), elapsed_s / (args.max_minutes * 60))
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    step = 0
    elapsed_before = 0.0
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.ckpt_dir / "last.pt"
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        elapsed_before = state.get("elapsed_s", 0.0)
        print(f"resumed from {ckpt} at step {step}/{total}")

    started = time.monotonic() - elapsed_before
    net.train()
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    bar = tqdm(total=total, initial=step, desc="train", mininterval=10)
    ema = None
    while step < total:
        epoch = step // steps_per_epoch
        order = batches(train, args.batch_size, random.Random(args.seed * 1000 + epoch))
        for b in order[step % steps_per_epoch :]:
            tensors, labels = to_tensors([train[i] for i in b], device)
            logits = net(**tensors)
            loss = loss_fn(logits.flatten(0, 1), labels.flatten())
            lr = lr_at(step, time.monotonic() - started)
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
            out_of_time = time.monotonic() - started > args.max_minutes * 60
            if step % args.ckpt_every == 0 or step >= total or out_of_time:
                torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step,
                            "elapsed_s": time.monotonic() - started}, ckpt)
            if step >= total or out_of_time:
                break
        if time.monotonic() - started > args.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes reached")
            break
    bar.close()

    threshold, dev_figures = pick_threshold(dev, dev_probs(net, dev, device), dev_truth)
    print(f"threshold {threshold:.2f} on dev: {json.dumps(dev_figures)}")
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()},
              str(args.out / "model.safetensors"))
    vocab.save(args.out / "vocab.json")
    meta = {
        "name": "nbest-candidate-corrector",
        "version": time.strftime("%Y.%m.%d"),
        "net": net_cfg.to_dict(),
        "threshold": threshold,
        "trained": {"steps": step, "examples": len(train), "args": {k: str(v) for k, v in vars(args).items()},
                    "dev": dev_figures},
    }
    cfg_path = args.out / "config.json"
    if cfg_path.exists():  # keep the evaluation figures written by model.evaluate, if any
        meta["evaluation"] = json.loads(cfg_path.read_text(encoding="utf-8")).get("evaluation")
    cfg_path.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
