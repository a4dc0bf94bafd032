"""Train a small character masked LM on the project's corpus and save it as a Hugging Face folder:
`python -m learn.masked_lm --out DIR [--minutes 25] [--layers 3]` (`make masked-lm OUT=DIR`).

It exists to prove the `MLM_DIR` path (`model.masked_lm`) with a model made here, exactly as a team's downloaded
checkpoint would be used: a `BertForMaskedLM` and a BERT tokenizer whose tokens are single characters (as Chinese
BERT, MacBERT and RoBERTa-wwm-ext hold them), written by `save_pretrained` and read back by `AutoModelForMaskedLM` and
`AutoTokenizer` from the folder alone. It knows only the news text of `data/corpus/train.txt` (`make corpus`), so it
is no stand-in for a pretrained Chinese model's knowledge; it is what a CPU learns in half an hour.

Training masks what the second stage asks about: spans of one to three consecutive characters (about 15 % of a
sentence's characters), always replaced by `[MASK]`, the loss on those positions alone. It stops at `--minutes`
(or `--steps`) and writes the folder whole (built beside `--out`, renamed into place; a stopped run leaves nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MIN_COUNT = 2  # a character seen once in the corpus is [UNK]
MAX_POSITIONS = 128  # the second stage asks about a TOP1 of at most 45 characters (MAX_TOP1_CHARS) and its span


def read_sentences(path: Path) -> list[str]:
    return [s[: MAX_POSITIONS - 2] for s in path.read_text(encoding="utf-8").split("\n") if s]


def build_vocab(sentences: list[str]) -> dict[str, int]:
    """The special tokens, then every character seen at least MIN_COUNT times, most frequent first."""
    counts = Counter(c for s in sentences for c in s)
    chars = [c for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n >= MIN_COUNT]
    return {t: i for i, t in enumerate((*SPECIAL, *chars))}


def masked_batch(sentences: list[str], vocab: dict[str, int], rng: random.Random) -> dict[str, torch.Tensor]:
    """Input ids with spans of 1-3 characters masked (about 15 % of each sentence), labels there (-100 elsewhere)."""
    unk, cls, sep, mask, pad = (vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]"))
    width = 2 + max(len(s) for s in sentences)
    ids = torch.full((len(sentences), width), pad, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for row, s in enumerate(sentences):
        chars = [vocab.get(c, unk) for c in s]
        ids[row, : len(chars) + 2] = torch.tensor([cls, *chars, sep])
        budget = max(1, round(0.15 * len(chars)))
        while budget > 0:
            span = min(budget, rng.choice((1, 1, 2, 2, 3)), len(chars))
            start = 1 + rng.randrange(len(chars) - span + 1)
            labels[row, start : start + span] = ids[row, start : start + span]
            ids[row, start : start + span] = mask
            budget -= span
    return {"input_ids": ids, "attention_mask": (ids != pad).long(), "labels": labels}


def accuracy(model: torch.nn.Module, sentences: list[str], vocab: dict[str, int], seed: int = 0) -> dict[str, float]:
    """Loss and share of masked characters guessed right on held-out sentences (the same masks every call)."""
    rng = random.Random(seed)
    model.eval()
    right = total = 0
    loss = 0.0
    with torch.inference_mode():
        for start in range(0, len(sentences), 128):
            batch = masked_batch(sentences[start : start + 128], vocab, rng)
            out = model(**batch)
            where = batch["labels"] != -100
            right += int((out.logits.argmax(-1)[where] == batch["labels"][where]).sum())
            total += int(where.sum())
            loss += float(out.loss) * int(where.sum())
    model.train()
    return {"loss": loss / max(1, total), "accuracy": right / max(1, total), "masked": total}


def train(corpus: Path, out: Path, minutes: float, steps: int, layers: int, hidden: int, batch_size: int,
          lr: float, seed: int, threads: int) -> dict:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    rng = random.Random(seed)
    sentences = read_sentences(corpus / "train.txt")
    dev = read_sentences(corpus / "dev.txt")[:2000]
    vocab = build_vocab(sentences)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                        max_position_embeddings=MAX_POSITIONS, pad_token_id=vocab["[PAD]"])
    model = BertForMaskedLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = 200
    deadline = time.monotonic() + 60 * minutes
    order: list[int] = []
    step = 0
    t0 = time.monotonic()
    print(f"{len(sentences)} sentences, {len(vocab)} tokens, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters; at most {minutes:g} min" + (f" or {steps} steps" if steps else ""), flush=True)
    while time.monotonic() < deadline and (not steps or step < steps):
        if len(order) < batch_size:
            order = list(range(len(sentences)))
            rng.shuffle(order)
        picked = [sentences[order.pop()] for _ in range(batch_size)]
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        loss = model(**masked_batch(picked, vocab, rng)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        if step % 200 == 0:
            print(f"step {step}: loss {float(loss):.3f} ({time.monotonic() - t0:.0f} s)", flush=True)
    figures = accuracy(model, dev, vocab)
    print(f"dev (the corpus's dev split, {figures['masked']} masked characters): loss {figures['loss']:.3f}, "
          f"accuracy {figures['accuracy']:.1%}", flush=True)
    model.eval()
    record = {"steps": step, "minutes": round((time.monotonic() - t0) / 60, 1), "sentences": len(sentences),
              "dev": figures, "layers": layers, "hidden": hidden, "seed": seed,
              "made_by": "python -m learn.masked_lm (a character masked LM of this project's news corpus)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        model.save_pretrained(build)
        BertTokenizer(vocab=vocab, do_lower_case=False).save_pretrained(build)
        (build / "training.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        build.rename(out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the Hugging Face folder to write (replaced whole)")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="where make corpus wrote train.txt")
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: at --minutes)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    args = ap.parse_args(argv)
    if not (args.corpus / "train.txt").is_file():
        print(f"masked_lm: {args.corpus / 'train.txt'} does not exist: run make corpus first", file=sys.stderr)
        return 2
    try:
        record = train(args.corpus, args.out, args.minutes, args.steps, args.layers, args.hidden, args.batch_size,
                       args.lr, args.seed, args.threads)
    except KeyboardInterrupt:
        print(f"masked_lm: interrupted; {args.out} was not written", file=sys.stderr)
        return 130
    print(f"wrote {args.out} ({record['steps']} steps, {record['minutes']} min): serve it with MLM_DIR={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
