"""The correction network: a small non-autoregressive Transformer encoder that scores candidates.

The encoder (a `transformers` BertModel fed with `inputs_embeds`) reads TOP1 with, at each position,
its syllable, tone, word-boundary tag, column statistics and a summary of what the other hypotheses
offer there. Each candidate is scored by a dot product between the position's state and the candidate's
embedding plus its features: a choice among at most MAX_CANDIDATES, not a softmax over the vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional
from transformers import BertConfig, BertModel

from model.contract import CANDIDATE_FEATURES
from model.features import MAX_LEN, N_CAND_FEATS, N_POS_FEATS, PAD

KEEP = CANDIDATE_FEATURES.index("keep")
VOTE_SHARE = CANDIDATE_FEATURES.index("vote_share")


@dataclass(frozen=True)
class NetConfig:
    n_chars: int
    n_syllables: int
    hidden: int = 256
    layers: int = 3
    heads: int = 4
    ffn: int = 1024
    dropout: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


class CorrectorNet(nn.Module):
    """Score every candidate at every TOP1 position."""

    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.cfg = cfg
        self.char_emb = nn.Embedding(cfg.n_chars, h, padding_idx=PAD)
        self.syl_emb = nn.Embedding(cfg.n_syllables, h, padding_idx=PAD)
        self.tone_emb = nn.Embedding(6, h)
        self.bnd_emb = nn.Embedding(5, h)
        self.pos_proj = nn.Linear(N_POS_FEATS, h)
        self.col_proj = nn.Linear(h, h)
        bert = BertConfig(
            vocab_size=4,
            hidden_size=h,
            num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads,
            intermediate_size=cfg.ffn,
            max_position_embeddings=MAX_LEN,
            type_vocab_size=1,
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.dropout,
        )
        self.encoder = BertModel(bert, add_pooling_layer=False)
        # The encoder computes no loss. torch.jit.trace reads every attribute of a module, and transformers'
        # `loss_function` property then logs a plain-text warning on stderr ("loss_type=None was set in the config")
        # at each load.
        self.encoder.loss_function = None
        self.query = nn.Linear(h, h)
        self.cand_proj = FeatureProjection(N_CAND_FEATS, h)
        self.cand_bias = FeatureProjection(N_CAND_FEATS, 1)
        self.scale = 1.0 / math.sqrt(h)

    def forward(
        self,
        chars: torch.Tensor,
        syl: torch.Tensor,
        tone: torch.Tensor,
        bnd: torch.Tensor,
        pos_feats: torch.Tensor,
        cand_ids: torch.Tensor,
        cand_feats: torch.Tensor,
        cand_mask: torch.Tensor,
        attn_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Return candidate logits [B, L, C]; masked candidates get a large negative score.

        A candidate's score is the dot product of its position's query with its representation (the mean of its
        characters' embeddings plus its projected features), scaled, plus a bias from its features. It is computed as
        the algebra allows rather than as written: the features' part as one small product with the query mapped
        back onto the features (`q·(W f + b) = (Wᵀq)·f + q·b`), and the embeddings' mean as their sum divided per
        candidate after the dot product. The same scores, without building two more [B, L, C, H] tensors: those
        passes over memory were a quarter of the forward pass on CPU (issue 46).
        """
        cand_sum = self.candidate_sums(cand_ids)  # [B, L, C, H]
        inv_n = 1.0 / (cand_ids != PAD).sum(-1).clamp(min=1).to(cand_sum.dtype)  # [B, L, C]
        offered = cand_feats[..., VOTE_SHARE] * (1.0 - cand_feats[..., KEEP])  # vote share, keep excluded
        column = ((offered * inv_n).unsqueeze(-2) @ cand_sum).squeeze(-2)  # [B, L, H]: offered-weighted mean
        x = (
            self.char_emb(chars)
            + self.syl_emb(syl)
            + self.tone_emb(tone)
            + self.bnd_emb(bnd)
            + self.pos_proj(pos_feats)
            + self.col_proj(column)
        )
        hidden = self.encoder(inputs_embeds=x, attention_mask=attn_mask).last_hidden_state
        q = self.query(hidden)  # [B, L, H]
        emb_score = (cand_sum @ q.unsqueeze(-1)).squeeze(-1) * inv_n  # [B, L, C]: q · mean embedding
        feat_weights = (q @ self.cand_proj.weight) * self.scale + self.cand_bias.weight.squeeze(0)  # [B, L, F]
        feat_score = (cand_feats @ feat_weights.unsqueeze(-1)).squeeze(-1)  # [B, L, C]
        offset = (q @ self.cand_proj.bias) * self.scale + self.cand_bias.bias  # [B, L]
        logits = emb_score * self.scale + feat_score + offset.unsqueeze(-1)
        return logits.masked_fill(~cand_mask, -1e4)

    def candidate_sums(self, cand_ids: torch.Tensor) -> torch.Tensor:
        """The sum of each candidate's character embeddings [B, L, C, H], one bag of S ids per candidate: the sums slot
        by slot, to the bit, without a [B, L, C, H] tensor per slot (gathered slot by slot and added, they were the
        forward pass's largest passes over memory: issue 61). PAD embeds to zero (`char_emb`'s `padding_idx`); in
        training it is also left out of the bags, so that it gets no gradient from them (ONNX's exporter cannot
        export that, so not in eval, where summing the zero row changes nothing)."""
        batch, length, n_cands, n_slots = cand_ids.shape
        sums = functional.embedding_bag(cand_ids.reshape(-1, n_slots), self.char_emb.weight, mode="sum",
                                        padding_idx=PAD if self.training else None)
        return sums.view(batch, length, n_cands, -1)


class FeatureProjection(nn.Module):
    """A linear map of the candidate features that `CorrectorNet.forward` folds into its scores by hand (so not an
    `nn.Linear`, which dynamic quantization would replace by a module without these parameters); the weights are
    stored under the names an `nn.Linear` gives them."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        layer = nn.Linear(n_in, n_out)  # its initialisation
        self.weight = nn.Parameter(layer.weight.detach().clone())  # [n_out, n_in]
        self.bias = nn.Parameter(layer.bias.detach().clone())  # [n_out]
