"""Building blocks of GEM: Wukong interaction layers, InterFormer's cross arch and sequence arch.

Jagged conventions: a sequence batch is `values [L_total, d]` + `offsets [B+1]` (int64);
`seg [L_total]` is the row of each value (`repeat_interleave(arange(B), lengths)`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import kernels


def segment_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total)


def segment_softmax(scores: torch.Tensor, seg: torch.Tensor, batch: int) -> torch.Tensor:
    """Softmax of scores [L, ...] within each segment of seg [L], in fp32 (autocast's fp32 `exp` and bf16
    scores must not meet in one index_add); the result has the scores' dtype."""
    s32 = scores.float()
    idx = seg.view(-1, *([1] * (s32.dim() - 1))).expand_as(s32)
    mx = s32.new_full((batch, *s32.shape[1:]), -1e30).scatter_reduce(0, idx, s32.detach(), "amax", include_self=True)
    e = torch.exp(s32 - mx[seg])
    denom = s32.new_zeros((batch, *s32.shape[1:])).index_add(0, seg, e)
    return (e / denom[seg].clamp_min(1e-30)).to(scores.dtype)


def segment_sum(values: torch.Tensor, seg: torch.Tensor, batch: int, weights: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum over each segment of `weights * values` ([L, ...] -> [batch, ...]), accumulated in fp32 whatever
    dtypes arrive, cast once to `out_dtype` (default: the values' dtype)."""
    v = values.float() if weights is None else weights.float() * values.float()
    out = v.new_zeros((batch, *v.shape[1:])).index_add(0, seg, v)
    return out.to(out_dtype or values.dtype)


def segment_max(values: torch.Tensor, seg: torch.Tensor, batch: int, floor: float = 0.0) -> torch.Tensor:
    """max(floor, max of each 1-D segment) (`floor` for an empty segment), in fp32, values' dtype out."""
    v = values.float()
    out = v.new_full((batch,), floor).scatter_reduce(0, seg, v, "amax", include_self=True)
    return out.to(values.dtype)


class MLP(nn.Sequential):
    def __init__(self, d_in: int, hidden: int, d_out: int, dropout: float = 0.0):
        # Identity for dropout 0 (same indices, so the same state dict): no dropout op per call
        drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        super().__init__(nn.Linear(d_in, hidden), nn.GELU(), drop, nn.Linear(hidden, d_out))


# ------------------------------------------------------------------------------------------------
# Wukong (arXiv 2403.02545): X' = LN(concat(FMB(X), LCB(X)) + X)


class FMB(nn.Module):
    """Factorization machine block: reshape(MLP(LN(flatten(X (X^T Y))))) -> [B, n_F, d]."""

    def __init__(self, n_in: int, d: int, k: int, n_out: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.n_out, self.d = n_out, d
        self.Y = nn.Parameter(torch.randn(n_in, k) / math.sqrt(n_in))
        self.ln = nn.LayerNorm(n_in * k)
        self.mlp = MLP(n_in * k, hidden, n_out * d, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, n, d]
        xty = torch.matmul(x.transpose(1, 2), self.Y)  # X^T Y first: [B, d, k], O(n d k)
        z = torch.matmul(x, xty)  # X (X^T Y): [B, n, k], never the n x n matrix
        return self.mlp(self.ln(z.flatten(1))).view(x.shape[0], self.n_out, self.d)


class LCB(nn.Module):
    """Linear compression block: W_L X, [n_L, n] x [B, n, d] -> [B, n_L, d]."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.W, x)


class WukongLayer(nn.Module):
    """n_F + n_L = n_out tokens out; when n_out < n_in (an interaction arch's last layer returns only the
    non-sequence tokens) the residual is the first n_out input tokens."""

    def __init__(self, n_in: int, d: int, k: int, hidden: int, fm_frac: float = 0.5, dropout: float = 0.0,
                 n_out: int | None = None):
        super().__init__()
        n_out = n_out or n_in
        self.n_out = n_out
        n_f = min(max(1, round(fm_frac * n_out)), n_out - 1) if n_out > 1 else 1
        n_l = n_out - n_f
        self.fmb = FMB(n_in, d, k, n_f, hidden, dropout)
        self.lcb = LCB(n_in, n_l) if n_l > 0 else None
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [self.fmb(x)] + ([self.lcb(x)] if self.lcb is not None else [])
        return self.ln(torch.cat(parts, dim=1) + x[:, : self.n_out])


class Wukong(nn.Sequential):
    """`layers` Wukong layers on n_in tokens; the last one returns n_out tokens."""

    def __init__(self, n_in: int, d: int, layers: int, k: int, hidden: int, fm_frac: float, dropout: float = 0.0,
                 n_out: int | None = None):
        super().__init__(*[
            WukongLayer(n_in, d, k, hidden, fm_frac, dropout, n_out=(n_out if i == layers - 1 else n_in))
            for i in range(layers)
        ])


# ------------------------------------------------------------------------------------------------
# InterFormer (arXiv 2411.09852): cross arch summaries


class GatedCompression(nn.Module):
    """X_sum = LN((W X) * sigmoid(G X)): n non-sequence tokens -> n_sum tokens."""

    def __init__(self, n_in: int, n_out: int, d: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.G = nn.Parameter(torch.zeros(n_out, n_in))
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(torch.matmul(self.W, x) * torch.sigmoid(torch.matmul(self.G, x)))


class PMA(nn.Module):
    """Pooling by multi-head attention over each jagged sequence; the seeds are personalised by the row's
    X_sum (target-aware, as in DIN), so the pool can look for history entries that match the candidate ad."""

    def __init__(self, d: int, n_seeds: int, n_heads: int, cond_dim: int):
        super().__init__()
        self.h, self.dh = n_heads, d // n_heads
        self.seeds = nn.Parameter(torch.randn(n_seeds, d) * 0.02)
        self.q_cond = nn.Linear(cond_dim, n_seeds * d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def forward(self, values: torch.Tensor, seg: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        batch, n_seeds = cond.shape[0], self.seeds.shape[0]
        k, v = self.kv(values).view(-1, 2, self.h, self.dh).unbind(1)  # [L, H, Dh]
        q = (self.seeds[None] + self.q_cond(cond).view(batch, n_seeds, -1)).view(batch, n_seeds, self.h, self.dh)
        scores = torch.einsum("lhd,lphd->lph", k, q[seg]) / math.sqrt(self.dh)  # [L, P, H]
        w = segment_softmax(scores, seg, batch)
        pooled = segment_sum(v[:, None], seg, batch, weights=w[..., None])  # [B, P, H, Dh], fp32 accumulation
        return self.out(pooled.reshape(batch, n_seeds, self.h * self.dh))


class CrossArch(nn.Module):
    """X_sum (for the sequence arch) and S_sum = CLS || PMA || most recent (|| target-attention) tokens
    (for the interaction arch)."""

    def __init__(self, n_tokens: int, d: int, n_sum: int, n_cls: int, n_pma: int, n_recent: int, n_heads: int):
        super().__init__()
        self.n_cls, self.n_recent = n_cls, n_recent
        self.compress = GatedCompression(n_tokens, n_sum, d)
        self.ln_seq = nn.LayerNorm(d)
        self.pma = PMA(d, n_pma, n_heads, n_sum * d) if n_pma > 0 else None
        self.ln_out = nn.LayerNorm(d)

    def forward(
        self, x: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, seg: torch.Tensor, hist_len: torch.Tensor,
        target: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_sum = self.compress(x)
        starts, ends = offsets[:-1], offsets[1:]
        parts = [values[starts[:, None] + torch.arange(self.n_cls, device=x.device)]]  # CLS [B, n_cls, d]
        if self.pma is not None:
            parts.append(self.pma(self.ln_seq(values), seg, x_sum.flatten(1)))
        if self.n_recent:
            j = torch.arange(self.n_recent, device=x.device)
            pos = ends[:, None] - 1 - j  # most recent first; CLS tokens keep the index valid
            valid = (hist_len[:, None] > j).to(values.dtype)
            parts.append(values[pos] * valid[..., None])
        if target is not None:
            parts.append(target)
        return x_sum, self.ln_out(torch.cat(parts, dim=1))


# ------------------------------------------------------------------------------------------------
# InterFormer sequence arch: personalised FFN, then multi-head attention over the jagged sequence


class PersonalisedFFN(nn.Module):
    """FFN whose input is modulated (FiLM) by the row's X_sum: FFN(LN(s) * (1 + g) + b)."""

    def __init__(self, d: int, cond_dim: int, mult: int, dropout: float = 0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.film = nn.Linear(cond_dim, 2 * d)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.ffn = MLP(d, mult * d, d, dropout)

    def forward(self, s: torch.Tensor, cond: torch.Tensor, seg: torch.Tensor | None) -> torch.Tensor:
        g, b = self.film(cond).chunk(2, dim=-1)  # [B, d] each
        if seg is not None:  # jagged: s [L, d]
            g, b = g[seg], b[seg]
        else:  # padded: s [B, N, d]
            g, b = g[:, None], b[:, None]
        return self.ffn(self.ln(s) * (1 + g) + b)


class SequenceMHA(nn.Module):
    """Pre-LN multi-head self-attention inside each sequence."""

    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.h, self.dh = n_heads, d // n_heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward_jagged(self, s: torch.Tensor, offsets: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
        """`max_len` (longest sequence, from the loader) spares the kernel a read-back of the offsets."""
        # strided views of the fused projection (unit last stride): both backends take them without copies
        q, k, v = self.qkv(self.ln(s)).view(-1, 3, self.h, self.dh).unbind(1)  # [L, H, Dh]
        o = kernels.jagged_attention(q, k, v, offsets, max_len=max_len)
        return self.out(o.reshape(-1, self.h * self.dh))

    def forward_padded(self, s: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        bsz, n, d = s.shape
        q, k, v = self.qkv(self.ln(s)).view(bsz, n, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)  # [B, H, N, Dh]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return self.out(o.transpose(1, 2).reshape(bsz, n, d))


class TimeGapEncoding(nn.Module):
    """seconds_before -> embedding of its log2 bucket (1 s ... ~2^buckets s)."""

    def __init__(self, buckets: int, d: int):
        super().__init__()
        self.buckets = buckets
        self.emb = nn.Embedding(buckets, d)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, seconds: torch.Tensor) -> torch.Tensor:
        b = torch.log2(1.0 + seconds.float().clamp_min(0.0)).long().clamp_(0, self.buckets - 1)
        return self.emb(b)
