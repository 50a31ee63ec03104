"""GEM: the foundation ranking model, top to bottom.

    sparse ids ──> embedding tokens ─┐
    dense feats ─> one dense token ──┴─> X [B, n, d]
    history (jagged) ─> item+action+surface embeddings + time-gap encoding ─> S [L_total, d]
                        (with n_cls CLS tokens prepended to every sequence)

    for each InterFormer block:
        cross arch:        X_sum = gated compression of X;  S_sum = CLS || PMA || most recent of S
        interaction arch:  X <- Wukong([X || S_sum])[:, :n]
        sequence arch:     S <- S + PFFN(S | X_sum);  S <- S + MHA(S)  (kernels.jagged_attention)
        (the two arches read the block's input: they are independent within a block)

    summary h = MLP(flatten([X || S_sum]))      <- `summary_embedding`, used for distillation
    logits[b, t] = head[surface_b, t](h_b)       one head per (surface, task)
    loss = sum_t w_t * sum_b w_surface(b) * mask[b, t] * BCE(logits, labels) / sum_b mask[b, t]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from gem_model.data import TASKS, Batch
from gem_model.models.config import GEMConfig
from gem_model.models.layers import (
    MLP,
    CrossArch,
    PersonalisedFFN,
    SequenceMHA,
    TimeGapEncoding,
    Wukong,
    segment_ids,
)


class InterFormerBlock(nn.Module):
    def __init__(self, cfg: GEMConfig):
        super().__init__()
        d, n = cfg.d_model, cfg.n_tokens
        self.cfg = cfg
        self.cross = CrossArch(n, d, cfg.n_sum, cfg.n_cls, cfg.n_pma, cfg.n_recent, cfg.n_heads)
        self.interaction = Wukong(
            n + cfg.n_seq_summary, d, cfg.wukong_layers, cfg.wukong_k, cfg.wukong_hidden, cfg.wukong_fm_frac, cfg.dropout
        )
        self.pffn = PersonalisedFFN(d, cfg.n_sum * d, cfg.ffn_mult, cfg.dropout)
        self.mha = SequenceMHA(d, cfg.n_heads)

    def forward(
        self, x: torch.Tensor, s: torch.Tensor, offsets: torch.Tensor, seg: torch.Tensor, hist_len: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[1]
        x_sum, s_sum = self.cross(x, s, offsets, seg, hist_len)
        x_new = self.interaction(torch.cat([x, s_sum], dim=1))[:, :n]
        assert x_sum is not None
        cond = x_sum.flatten(1)
        if self.cfg.attention == "jagged":
            s = s + self.pffn(s, cond, seg)
            s = s + self.mha.forward_jagged(s, offsets)
        else:  # the padded variant of the same layer (benchmarks, equivalence tests)
            lengths = offsets[1:] - offsets[:-1]
            max_len = int(lengths.max()) if lengths.numel() else 0
            p = kernels.jagged_to_padded(s, offsets, max_len)
            key_mask = torch.arange(max_len, device=s.device)[None, :] < lengths[:, None]
            p = p + self.pffn(p, cond, None)
            p = p + self.mha.forward_padded(p, key_mask)
            s = kernels.padded_to_jagged(p, offsets)
        return x_new, s


class GEM(nn.Module):
    def __init__(self, cfg: GEMConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        # -- inputs ---------------------------------------------------------------------------
        self.tables = nn.ModuleDict({t: nn.Embedding(rows, d) for t, rows in cfg.tables.items()})
        self.dense = MLP(len(cfg.dense_features), 2 * d, d)
        self.dense_ln = nn.LayerNorm(len(cfg.dense_features))
        self.time = TimeGapEncoding(cfg.time_buckets, d)
        self.seq_ln = nn.LayerNorm(d)
        self.cls = nn.Parameter(torch.randn(cfg.n_cls, d) * 0.02)
        # -- trunk ----------------------------------------------------------------------------
        self.blocks = nn.ModuleList([InterFormerBlock(cfg) for _ in range(cfg.n_blocks)])
        self.final_cross = CrossArch(
            cfg.n_tokens, d, cfg.n_sum, cfg.n_cls, cfg.n_pma, cfg.n_recent, cfg.n_heads, with_x_sum=False
        )
        self.summary = MLP((cfg.n_tokens + cfg.n_seq_summary) * d, cfg.head_hidden, cfg.summary_dim, cfg.dropout)
        self.summary_ln = nn.LayerNorm(cfg.summary_dim)
        # -- heads: one per (surface, task) ---------------------------------------------------
        n_s = len(cfg.surfaces)
        self.head_w = nn.Parameter(torch.randn(n_s, len(TASKS), cfg.summary_dim) * 0.01)
        self.head_b = nn.Parameter(torch.full((n_s, len(TASKS)), -3.0))
        allowed = torch.tensor([[t in tasks for t in TASKS] for tasks in cfg.surface_tasks], dtype=torch.bool)
        self.register_buffer("task_allowed", allowed.reshape(n_s, len(TASKS)), persistent=False)
        w_s = torch.tensor([cfg.surface_loss_weights.get(s, 1.0) for s in cfg.surfaces], dtype=torch.float32)
        self.register_buffer("surface_w", w_s, persistent=False)
        w_t = torch.tensor([cfg.task_loss_weights.get(t, 1.0) for t in TASKS], dtype=torch.float32)
        self.register_buffer("task_w", w_t, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.05)

    # -- inputs ---------------------------------------------------------------------------------
    def embed(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """X [B, n, d]; S [L_total + B*n_cls, d] with CLS tokens first in every sequence; its
        offsets, segment ids and the history lengths (without CLS)."""
        cfg = self.cfg
        tokens = [self.tables[table](batch.sparse[:, j]) for j, (_, table) in enumerate(cfg.sparse_features)]
        tokens.append(self.dense(self.dense_ln(batch.dense)))
        x = torch.stack(tokens, dim=1)

        offsets = batch.offsets.long()
        hist_len = offsets[1:] - offsets[:-1]
        total = int(batch.history[cfg.history_columns[0][0]].shape[0]) if cfg.history_columns else 0
        h = None
        for name, source, table in cfg.history_columns:
            e = self.time(batch.history[name]) if source == "ts" else self.tables[table](batch.history[name])
            h = e if h is None else h + e
        if h is None:
            h = x.new_zeros(total, cfg.d_model)
        h = self.seq_ln(h)

        bsz, n_cls = x.shape[0], cfg.n_cls
        ar = torch.arange(bsz + 1, device=x.device)
        new_off = offsets + n_cls * ar
        seg_h = segment_ids(offsets, total)
        hist_pos = torch.arange(total, device=x.device) + n_cls * (seg_h + 1)
        cls_pos = (new_off[:-1, None] + torch.arange(n_cls, device=x.device)).reshape(-1)
        s = h.new_zeros(total + bsz * n_cls, cfg.d_model)
        s = s.index_copy(0, hist_pos, h).index_copy(0, cls_pos, self.cls.to(h.dtype).repeat(bsz, 1))
        seg = segment_ids(new_off, total + bsz * n_cls)
        return x, s, new_off, seg, hist_len

    # -- trunk ----------------------------------------------------------------------------------
    def summary_embedding(self, batch: Batch) -> torch.Tensor:
        """The trunk's pooled representation h [B, summary_dim]."""
        x, s, offsets, seg, hist_len = self.embed(batch)
        for block in self.blocks:
            x, s = block(x, s, offsets, seg, hist_len)
        _, s_sum = self.final_cross(x, s, offsets, seg, hist_len)
        return self.summary_ln(self.summary(torch.cat([x, s_sum], dim=1).flatten(1)))

    def head_logits(self, h: torch.Tensor, surface_idx: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bd,btd->bt", h, self.head_w[surface_idx]) + self.head_b[surface_idx]

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [B, 2] (click, conversion) of each row's surface heads."""
        return self.head_logits(self.summary_embedding(batch), batch.surface_idx)

    def forward_with_summary(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.summary_embedding(batch)
        return self.head_logits(h, batch.surface_idx), h

    # -- loss -----------------------------------------------------------------------------------
    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch.label_mask & self.task_allowed[batch.surface_idx]
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch.labels.float(), reduction="none")
        w = mask.float() * self.surface_w[batch.surface_idx][:, None]
        per_task = (bce * w).sum(0) / mask.float().sum(0).clamp_min(1.0)
        total = (per_task * self.task_w).sum()
        return total, {t: per_task[i].detach() for i, t in enumerate(TASKS)}

    # -- bookkeeping ----------------------------------------------------------------------------
    def param_counts(self) -> dict[str, int]:
        sparse = sum(p.numel() for p in self.tables.parameters())
        total = sum(p.numel() for p in self.parameters())
        return {"sparse": sparse, "dense": total - sparse, "total": total}

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.tables.parameters())

    def dense_parameters(self) -> list[nn.Parameter]:
        emb = {id(p) for p in self.embedding_parameters()}
        return [p for p in self.parameters() if id(p) not in emb]


def build_model(cfg: GEMConfig | dict[str, Any], device: torch.device | str | None = None) -> GEM:
    if isinstance(cfg, dict):
        cfg = GEMConfig.from_dict(cfg)
    model = GEM(cfg)
    return model.to(device) if device is not None else model
