"""DIN-style target attention of the candidate ad over the user's history (arXiv 1706.06978).

Scores: a DIN activation unit MLP([q, k, q*k, q-k]) plus a bilinear q.k / sqrt(d), on learned
projections q = W_q(candidate), k = W_k(history item) (ads appear in histories as items). Two
poolings of the projected history tokens: softmax-normalised (*what* the matching history looks
like) and a sum of sigmoid-gated tokens over the preset's max length (*how much* of it matches,
which a softmax divides away). Match statistics per row (`forward`) also join the wide path, with
a positive initial weight (`STAT_INIT`): with zero, no gradient reaches the attention until the
deep path has learned to read it, and on a small window it never does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gem_model.models.config import MATCH_STATS
from gem_model.models.layers import segment_max, segment_softmax, segment_sum

N_STATS = len(MATCH_STATS)
STAT_INIT = 0.5  # initial wide weight of each match statistic
RAW_SCALE = 10.0  # embeddings start at std 0.05: a raw dot product starts ~100x smaller than a logit


class DINTargetAttention(nn.Module):
    def __init__(self, d: int, max_len: int, hidden: int = 32, dropout: float = 0.0):
        super().__init__()
        self.d, self.max_len = d, max(1, max_len)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d)
        self.unit = nn.Sequential(nn.Linear(4 * d, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, 1))
        self.ln = nn.LayerNorm(d)

    def forward(
        self, cand: torch.Tensor, items: torch.Tensor, tokens: torch.Tensor, seg: torch.Tensor,
        same: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cand [B, d], items/tokens [L, d], seg [L], same [L] (history entry is the candidate's id)
        -> (normalised [B, d], sum-pooled [B, d], stats [B, N_STATS], or N_STATS - 1 without `same`)."""
        batch = cand.shape[0]
        q = self.q(cand)[seg]
        k = self.k(items)
        score = self.unit(torch.cat([q, k, q * k, q - k], dim=-1)).squeeze(-1) + (q * k).sum(-1) / math.sqrt(self.d)
        v = self.v(tokens)
        soft = segment_softmax(score, seg, batch)
        gate = torch.sigmoid(score)
        # segment_sum/segment_max accumulate in fp32 whatever autocast hands over (bf16 v, fp32 weights)
        normed = segment_sum(v, seg, batch, weights=soft[:, None])
        summed = segment_sum(v, seg, batch, weights=gate[:, None]) / self.max_len
        f32 = torch.float32
        count = segment_sum(gate, seg, batch, out_dtype=f32)
        lengths = segment_sum(torch.ones_like(score), seg, batch, out_dtype=f32)
        best = torch.where(lengths > 0, segment_max(score, seg, batch, floor=-1e4).float(), 0.0)
        mean = segment_sum(score, seg, batch, out_dtype=f32) / lengths.clamp_min(1.0)
        # the raw (unprojected) candidate . item affinity, averaged over the history: a factorised
        # match that needs no projection to be learned first
        raw = (cand[seg] * items).sum(-1) * RAW_SCALE
        raw_mean = segment_sum(raw, seg, batch, out_dtype=f32) / lengths.clamp_min(1.0)
        cols = [torch.log1p(count), count / self.max_len, mean, best, raw_mean]
        if same is not None:  # without ids (checkpoints from before the statistic existed): N_STATS - 1 columns
            cols.append(torch.log1p(segment_sum(same.float(), seg, batch, out_dtype=f32)))
        stats = torch.stack(cols, dim=1)
        return self.ln(normed), summed, stats
