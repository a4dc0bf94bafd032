"""A masked-LM folder no one here trained: a random tiny BERT in Hugging Face's format, made in a test in a second or
two (its tokenizer holds the shipped vocabulary's characters, one token each, as a Chinese BERT's does)."""

from __future__ import annotations

import json
from pathlib import Path

from config import DEFAULT_WEIGHTS_DIR


def tiny_masked_lm(folder: Path, seed: int = 0, hidden: int = 16) -> Path:
    """Write a random 2-layer BERT masked LM and its tokenizer into `folder` (save_pretrained); return it."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    chars = json.loads((DEFAULT_WEIGHTS_DIR / "vocab.json").read_text(encoding="utf-8"))["chars"]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(c for c in chars if len(c) == 1)]
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokens), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(folder)
    BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=False).save_pretrained(folder)
    return folder



def weighing_folder(folder: Path, masked_lm: Path, weight: float = 1.0) -> Path:
    """The shipped weights copied into `folder`, their full stage weighing the masked LM in `masked_lm`."""
    from testing.mlm_cost import weighing_copy

    return weighing_copy(masked_lm, folder, weight)
