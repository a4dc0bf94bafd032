"""model.network: the candidate scores computed as the algebra allows are the scores as written."""

from __future__ import annotations

import math

import torch

from model.contract import CANDIDATE_FEATURES
from model.features import MAX_CANDIDATES, MAX_SEGMENT, N_CAND_FEATS, N_POS_FEATS, PAD
from model.network import CorrectorNet, FeatureProjection, NetConfig
from model.runtime import quantized

KEEP = CANDIDATE_FEATURES.index("keep")
VOTE_SHARE = CANDIDATE_FEATURES.index("vote_share")


def scores_as_written(net: CorrectorNet, chars, syl, tone, bnd, pos_feats, cand_ids, cand_feats, cand_mask,
                      attn_mask) -> torch.Tensor:
    """The network's definition: each candidate's mean embedding plus projected features, dotted with the query."""
    emb = net.char_emb(cand_ids)  # [B, L, C, S, H]
    n = (cand_ids != PAD).sum(-1, keepdim=True).clamp(min=1).float()
    cand_emb = emb.sum(-2) / n
    offered = cand_feats[..., VOTE_SHARE] * (1.0 - cand_feats[..., KEEP])
    column = (offered.unsqueeze(-1) * cand_emb).sum(2)
    x = (net.char_emb(chars) + net.syl_emb(syl) + net.tone_emb(tone) + net.bnd_emb(bnd) + net.pos_proj(pos_feats)
         + net.col_proj(column))
    hidden = net.encoder(inputs_embeds=x, attention_mask=attn_mask).last_hidden_state
    q = net.query(hidden).unsqueeze(2)
    proj, bias = net.cand_proj, net.cand_bias
    rep = cand_emb + cand_feats @ proj.weight.T + proj.bias
    logits = (q * rep).sum(-1) / math.sqrt(net.cfg.hidden) + (cand_feats @ bias.weight.T + bias.bias).squeeze(-1)
    return logits.masked_fill(~cand_mask, -1e4)


def random_inputs(batch: int = 5, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cand_ids = torch.randint(3, 50, (batch, length, MAX_CANDIDATES, MAX_SEGMENT), generator=g)
    cand_ids[..., 1] = torch.where(torch.rand(batch, length, MAX_CANDIDATES, generator=g) < 0.7, PAD, cand_ids[..., 1])
    cand_mask = torch.rand(batch, length, MAX_CANDIDATES, generator=g) < 0.6
    cand_mask[..., 0] = True
    attn_mask = torch.ones(batch, length, dtype=torch.int64)
    attn_mask[0, length - 2 :] = 0
    return {"chars": torch.randint(3, 50, (batch, length), generator=g),
            "syl": torch.randint(2, 20, (batch, length), generator=g),
            "tone": torch.randint(0, 6, (batch, length), generator=g),
            "bnd": torch.randint(1, 5, (batch, length), generator=g),
            "pos_feats": torch.rand(batch, length, N_POS_FEATS, generator=g),
            "cand_ids": cand_ids, "cand_feats": torch.rand(batch, length, MAX_CANDIDATES, N_CAND_FEATS, generator=g),
            "cand_mask": cand_mask, "attn_mask": attn_mask}


def test_the_folded_candidate_scores_equal_the_scores_as_written():
    torch.manual_seed(0)
    net = CorrectorNet(NetConfig(n_chars=50, n_syllables=20, hidden=32, layers=1, heads=2, ffn=64)).eval()
    inputs = random_inputs()
    with torch.inference_mode():
        folded, written = net(**inputs), scores_as_written(net, **inputs)
    assert torch.allclose(folded, written, atol=1e-5), (folded - written).abs().max()


def test_the_feature_projections_keep_linear_layer_names_and_stay_fp32_when_the_network_is_quantized():
    net = CorrectorNet(NetConfig(n_chars=50, n_syllables=20, hidden=32, layers=1, heads=2, ffn=64)).eval()
    keys = set(net.state_dict())
    # the names the saved weights use
    assert {"cand_proj.weight", "cand_proj.bias", "cand_bias.weight", "cand_bias.bias"} <= keys
    int8 = quantized(net)  # as the corrector serves it on CPU
    assert isinstance(int8.cand_proj, FeatureProjection) and int8.cand_proj.weight.dtype == torch.float32
    assert type(int8.query) is not torch.nn.Linear  # the linear layers were quantized, these two were not
    with torch.inference_mode():
        assert int8(**random_inputs()).shape == (5, 7, MAX_CANDIDATES)


def test_candidate_sums_are_the_slot_by_slot_sums_to_the_bit():
    torch.manual_seed(0)
    net = CorrectorNet(NetConfig(n_chars=50, n_syllables=20, hidden=32, layers=1, heads=2, ffn=64)).eval()
    cand_ids = random_inputs(batch=6, length=9, seed=3)["cand_ids"]
    cand_ids[0, 0] = PAD  # a padded position: every slot PAD
    with torch.inference_mode():
        by_slot = net.char_emb(cand_ids[..., 0]) + net.char_emb(cand_ids[..., 1])
        assert torch.equal(net.candidate_sums(cand_ids), by_slot)
        assert not net.candidate_sums(cand_ids)[0, 0].any()


def test_training_leaves_the_padding_embedding_at_zero():
    net = CorrectorNet(NetConfig(n_chars=50, n_syllables=20, hidden=32, layers=1, heads=2, ffn=64))
    inputs = random_inputs()
    net(**inputs).logsumexp(-1).sum().backward()
    grad = net.char_emb.weight.grad
    assert grad is not None and grad[3:].abs().sum() > 0
    assert not grad[PAD].any()
