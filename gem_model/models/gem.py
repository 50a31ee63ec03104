"""GEM: the foundation ranking model, top to bottom.

    sparse ids ──> embedding tokens ─┐
    dense feats ─> one dense token ──┴─> X [B, n, d]
    history (jagged) ─> item+action+surface embeddings + time-gap encoding ─> S [L_total, d]
                        (with n_cls CLS tokens prepended to every sequence)
    dense feats:        standardised with the training window's (mean, std), stored as buffers
    target attention:   candidate ad vs history items of the same table (DIN activation unit on
                        learned projections): a softmax-pooled token (into S_sum), a sum-pooled
                        token (into X) and match statistics (into the dense token and the wide path)

    for each InterFormer block:
        cross arch:        X_sum = gated compression of X;  S_sum = CLS || PMA(S | X_sum) || most recent of S
        interaction arch:  X <- Wukong([X || S_sum])  (n + |S_sum| tokens in, n out)
        sequence arch:     S <- S + PFFN(S | X_sum);  S <- S + MHA(S)  (kernels.jagged_attention)
        (the two arches read the block's input: they are independent within a block)

    summary h = MLP(flatten([X || S_sum]))      <- `summary_embedding`; teacher_predictions stores it (`forward_with_summary`)
    logits[b, t] = head[surface_b, t](h_b) + wide[surface_b, t](dense_b) + sum_j w_t[id_bj]
                   + sum_i (w_t[item_i] + w_t[item_i x ad_b]) / sqrt(len_b)   (wide_cross_rows > 0)
                   (one deep head per (surface, task), keyed by surface name, plus a wide linear
                   path: Wide & Deep)
    loss = sum_t w_t * sum_b w_surface(b) * mask[b, t] * BCE(logits, labels) / sum_b mask[b, t]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from gem_model.data.batch import TASKS, Batch
from gem_model.models.config import GEMConfig
from gem_model.models.layers import (
    MLP,
    CrossArch,
    PersonalisedFFN,
    SequenceMHA,
    TimeGapEncoding,
    Wukong,
    segment_ids,
    segment_max,
    segment_sum,
)
from gem_model.models.target_attention import STAT_INIT, DINTargetAttention

CROSS = "_cross"  # key of the wide cross table (feature tables are named [a-z0-9_]+ without a leading _)
_GOLDEN = 0x9E3779B1


class Inputs(NamedTuple):
    x: torch.Tensor  # [B, n, d] non-sequence tokens
    s: torch.Tensor  # [L_total + B*n_cls, d] jagged sequence tokens, CLS first in each sequence
    offsets: torch.Tensor  # [B+1] offsets of s
    seg: torch.Tensor  # [L_total + B*n_cls] row of each token of s
    hist_len: torch.Tensor  # [B] history lengths (without CLS)
    target: torch.Tensor | None  # [B, n_target, d] target-attention tokens
    wide: torch.Tensor  # [B, n_wide] dense features + match statistics (the linear path)
    max_len: int | None = None  # longest sequence of s (host-side: no read-back from the device)
    cross: torch.Tensor | None = None  # [B, n_tasks] wide logit of the history-item x candidate crosses


class InterFormerBlock(nn.Module):
    def __init__(self, cfg: GEMConfig):
        super().__init__()
        d, n = cfg.d_model, cfg.n_tokens
        self.cfg = cfg
        self.cross = CrossArch(n, d, cfg.n_sum, cfg.n_cls, cfg.n_pma, cfg.n_recent, cfg.n_heads)
        self.interaction = Wukong(
            n + cfg.n_seq_summary, d, cfg.wukong_layers, cfg.wukong_k, cfg.wukong_hidden, cfg.wukong_fm_frac,
            cfg.dropout, n_out=n,
        )
        self.pffn = PersonalisedFFN(d, cfg.n_sum * d, cfg.ffn_mult, cfg.dropout)
        self.mha = SequenceMHA(d, cfg.n_heads)

    def forward(
        self, x: torch.Tensor, s: torch.Tensor, offsets: torch.Tensor, seg: torch.Tensor, hist_len: torch.Tensor,
        target: torch.Tensor | None = None, max_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_sum, s_sum = self.cross(x, s, offsets, seg, hist_len, target)
        x_new = self.interaction(torch.cat([x, s_sum], dim=1))  # [B, n, d]
        cond = x_sum.flatten(1)
        if self.cfg.attention == "jagged":
            s = s + self.pffn(s, cond, seg)
            s = s + self.mha.forward_jagged(s, offsets, max_len)
        else:  # the padded variant of the same layer (benchmarks, equivalence tests)
            lengths = offsets[1:] - offsets[:-1]
            if max_len is None:
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
        n_wide = len(cfg.wide_inputs)  # dense features, match statistics per target pair, topic statistics
        self.dense = MLP(n_wide, 2 * d, d)
        # training-window statistics (gem_model.data.normalization), saved with the weights
        self.register_buffer("dense_mean", torch.zeros(len(cfg.dense_features)))
        self.register_buffer("dense_std", torch.ones(len(cfg.dense_features)))
        if cfg.n_topic_stats:  # frozen topic vectors of the shared item table (gem_model.train.item_svd writes them)
            rows = cfg.tables[cfg.sparse_features[cfg.target_pairs[0][0]][1]]
            self.register_buffer("item_topic", torch.zeros(rows, cfg.topic_dim))
        if cfg.topic_log_share and cfg.n_topic_stats:  # what a candidate without a topic vector reads (item_svd)
            self.register_buffer("topic_stat_mean", torch.zeros(cfg.n_topic_stats))
        self.emb_drop = nn.Dropout(cfg.emb_dropout)
        self.time = TimeGapEncoding(cfg.time_buckets, d)
        self.seq_ln = nn.LayerNorm(d)
        self.cls = nn.Parameter(torch.randn(cfg.n_cls, d) * 0.02)
        self.target = nn.ModuleList([DINTargetAttention(d, cfg.seq_len, cfg.ta_hidden, cfg.dropout)
                                     for _ in cfg.target_pairs])
        # -- trunk ----------------------------------------------------------------------------
        self.blocks = nn.ModuleList([InterFormerBlock(cfg) for _ in range(cfg.n_blocks)])
        self.final_cross = CrossArch(cfg.n_tokens, d, cfg.n_sum, cfg.n_cls, cfg.n_pma, cfg.n_recent, cfg.n_heads)
        self.summary = MLP((cfg.n_tokens + cfg.n_seq_summary) * d, cfg.head_hidden, cfg.summary_dim, cfg.dropout)
        self.summary_ln = nn.LayerNorm(cfg.summary_dim)
        # -- heads: one per (surface, task), keyed by surface name (a warm start with one more
        # surface keeps the others' heads) --------------------------------------------------------
        n_s, n_t = len(cfg.surfaces), len(TASKS)
        own = 0.0 if cfg.shared_head else 0.01  # with a shared head, each surface's own starts at it (zero)
        self.head_w = nn.ParameterDict({s: nn.Parameter(torch.randn(n_t, cfg.summary_dim) * own)  # deep starts quiet
                                        for s in cfg.surfaces})
        self.head_w_shared = nn.Parameter(torch.randn(n_t, cfg.summary_dim) * 0.01) if cfg.shared_head else None
        self.head_b = nn.ParameterDict({s: nn.Parameter(torch.full((n_t,), -3.0)) for s in cfg.surfaces})
        wide0 = torch.zeros(n_t, n_wide)
        n_dense = len(cfg.dense_features)
        # the match statistics (and the topic statistics) start switched on
        wide0[:, n_dense:] = STAT_INIT
        if cfg.topic_log_share and cfg.n_topic_stats:  # a log share (~-3) at STAT_INIT: every start logit ~-1.5
            wide0[:, n_wide - 1] = 0.0
        self.wide = nn.ParameterDict({s: nn.Parameter(wide0.clone())  # a linear path, as in Wide & Deep
                                      for s in cfg.surfaces})
        # ... and a per-id logit offset per task for every sparse feature (a logistic regression on ids)
        wide_tables = {t: cfg.tables[t] for _, t in cfg.sparse_features}
        if cfg.wide_cross_rows and cfg.target_pairs:  # ... and per (history item, candidate) pair
            wide_tables[CROSS] = cfg.wide_cross_rows
        self.wide_tables = nn.ModuleDict({t: nn.Embedding(rows, len(TASKS)) for t, rows in wide_tables.items()})
        allowed = torch.tensor([[t in tasks for t in TASKS] for tasks in cfg.surface_tasks], dtype=torch.bool)
        self.register_buffer("task_allowed", allowed.reshape(n_s, len(TASKS)), persistent=False)
        w_s = torch.tensor([cfg.surface_loss_weights.get(s, 1.0) for s in cfg.surfaces], dtype=torch.float32)
        self.register_buffer("surface_w", w_s, persistent=False)
        w_t = torch.tensor([cfg.task_loss_weights.get(t, 1.0) for t in TASKS], dtype=torch.float32)
        self.register_buffer("task_w", w_t, persistent=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Embedding):
            if any(m is e for e in self.wide_tables.values()):
                nn.init.zeros_(m.weight)
            else:
                nn.init.normal_(m.weight, std=0.05)

    # -- inputs ---------------------------------------------------------------------------------
    def embed(self, batch: Batch) -> Inputs:
        """Tokens of a batch: X, the jagged S with CLS tokens, target tokens, the wide inputs."""
        cfg = self.cfg
        tokens = [self.emb_drop(self.tables[table](batch.sparse[:, j])) for j, (_, table) in enumerate(cfg.sparse_features)]

        offsets = batch.offsets.long()
        hist_len = offsets[1:] - offsets[:-1]
        total = int(batch.history[cfg.history_columns[0][0]].shape[0]) if cfg.history_columns else 0
        raw = {name: self.time(batch.history[name]) if source == "ts" else self.emb_drop(self.tables[table](batch.history[name]))
               for name, source, table in cfg.history_columns}
        h = self.seq_ln(sum(raw.values(), tokens[0].new_zeros(total, cfg.d_model)))
        seg_h = segment_ids(offsets, total)
        target = None
        dense_in = [(batch.dense.float() - self.dense_mean) / self.dense_std]
        pooled: list[torch.Tensor] = []
        if self.target:
            outs = [ta(tokens[j], raw[col], h, seg_h,
                       same=batch.history[col] == batch.sparse[seg_h, j] if cfg.exact_match else None)
                    for ta, (j, col) in zip(self.target, cfg.target_pairs, strict=True)]
            target = torch.stack([o[0] for o in outs], dim=1)
            pooled = [o[1] for o in outs]
            dense_in += [o[2].float() for o in outs]
        if cfg.n_topic_stats:
            dense_in.append(self.topic_stats(batch, seg_h, len(hist_len)))
        tokens.append(self.dense(torch.cat(dense_in, dim=1)))
        tokens += pooled
        x = torch.stack(tokens, dim=1)

        bsz, n_cls = x.shape[0], cfg.n_cls
        ar = torch.arange(bsz + 1, device=x.device)
        new_off = offsets + n_cls * ar
        hist_pos = torch.arange(total, device=x.device) + n_cls * (seg_h + 1)
        cls_pos = (new_off[:-1, None] + torch.arange(n_cls, device=x.device)).reshape(-1)
        s = h.new_zeros(total + bsz * n_cls, cfg.d_model)
        s = s.index_copy(0, hist_pos, h).index_copy(0, cls_pos, self.cls.to(h.dtype).repeat(bsz, 1))
        seg = segment_ids(new_off, total + bsz * n_cls)
        max_len = None if batch.max_len is None else batch.max_len + n_cls
        cross = self.cross_logit(batch, seg_h, hist_len) if CROSS in self.wide_tables else None
        return Inputs(x, s, new_off, seg, hist_len, target, torch.cat(dense_in, dim=1), max_len, cross)

    def topic_stats(self, batch: Batch, seg_h: torch.Tensor, bsz: int) -> torch.Tensor:
        """[B, 2]: mean and max over the history of cos(topic(candidate), topic(item)) on the
        frozen topic vectors (0 for an empty history or an id without one); [B, 3] with
        `topic_log_share`: and log((sum of max(cos, 0) + 0.5) / (length + 1)), and then a candidate
        without a topic vector reads the window's mean of each (`topic_stat_mean`), not "no interest":
        a log share of no match is the most negative value it takes, while the ad is only unplaced."""
        j, col = self.cfg.target_pairs[0]
        t = F.normalize(self.item_topic, dim=-1)
        candidate = batch.sparse[:, j].long()
        cos = (t[candidate[seg_h]] * t[batch.history[col].long()]).sum(-1)
        sums = segment_sum(torch.stack([torch.ones_like(cos), cos, cos.clamp_min(0.0)], 1), seg_h, bsz)
        lengths = sums[:, 0]
        mean = sums[:, 1] / lengths.clamp_min(1.0)
        best = torch.where(lengths > 0, segment_max(cos, seg_h, bsz, floor=-1.0), 0.0)
        if not self.cfg.topic_log_share:
            return torch.stack([mean, best], dim=1)
        stats = torch.stack([mean, best, torch.log((sums[:, 2] + 0.5) / (lengths + 1.0))], dim=1)
        return torch.where(self.has_topic(candidate)[:, None], stats, self.topic_stat_mean.to(stats.dtype))

    def wide_input_keys(self) -> list[str]:
        """The state-dict entries whose last dimension is `cfg.wide_inputs` (a warm start maps it by name)."""
        return ["dense.0.weight", *(f"wide.{s}" for s in self.cfg.surfaces)]

    def has_topic(self, ids: torch.Tensor) -> torch.Tensor:
        """[B] bool: the rows of the shared item table that carry a topic vector (fitted or folded in)."""
        return self.item_topic[ids.long()].abs().sum(-1) > 0

    def cross_logit(self, batch: Batch, seg_h: torch.Tensor, hist_len: torch.Tensor) -> torch.Tensor:
        """[B, n_tasks]: sum over the history of w[item] + w[item x candidate], 1/sqrt(length) each
        (the hashed crosses of gem_model.eval.baselines' logistic regression), for the first target pair."""
        j, col = self.cfg.target_pairs[0]
        rows = self.cfg.wide_cross_rows
        item_rows = self.cfg.tables[self.cfg.sparse_features[j][1]]
        items = batch.history[col].long()
        pair = items * item_rows + batch.sparse[seg_h, j].long()  # distinct per (item, candidate) pair
        # multiplicative hash, middle bits (the low bits of x * odd depend only on x's low bits)
        idx = torch.stack([items, pair + item_rows * item_rows], 1)
        idx = ((idx * _GOLDEN) >> 13) % rows
        w = (1.0 / hist_len.clamp_min(1).float().sqrt())[seg_h]
        table = self.wide_tables[CROSS]
        return segment_sum(table(idx).sum(1), seg_h, len(hist_len), weights=w[:, None], out_dtype=torch.float32)

    # -- trunk ----------------------------------------------------------------------------------
    def trunk(self, inp: Inputs) -> torch.Tensor:
        x, s, offsets, seg, hist_len, target = inp[:6]
        for block in self.blocks:
            x, s = block(x, s, offsets, seg, hist_len, target, max_len=inp.max_len)
        _, s_sum = self.final_cross(x, s, offsets, seg, hist_len, target)
        return self.summary_ln(self.summary(torch.cat([x, s_sum], dim=1).flatten(1)))

    def summary_embedding(self, batch: Batch) -> torch.Tensor:
        """The trunk's pooled representation h [B, summary_dim] (`forward_with_summary` returns it with the logits)."""
        return self.trunk(self.embed(batch))

    def head_logits(
        self, h: torch.Tensor, surface_idx: torch.Tensor, wide_in: torch.Tensor, sparse: torch.Tensor,
        cross: torch.Tensor | None = None,
    ) -> torch.Tensor:
        head_w, wide_w, head_b = (torch.stack([p[s] for s in self.cfg.surfaces])[surface_idx]
                                  for p in (self.head_w, self.wide, self.head_b))
        with torch.autocast(h.device.type, enabled=False):  # heads in fp32, whatever the autocast dtype
            deep = torch.einsum("bd,btd->bt", h.float(), head_w.float())
            if self.head_w_shared is not None:
                deep = deep + h.float() @ self.head_w_shared.float().T
            wide = torch.einsum("bk,btk->bt", wide_in.float(), wide_w.float())
            for j, (_, table) in enumerate(self.cfg.sparse_features):
                wide = wide + self.wide_tables[table](sparse[:, j]).float()
            if cross is not None:
                wide = wide + cross.float()
            return deep + wide + head_b.float()

    def set_dense_stats(self, mean: list[float] | torch.Tensor, std: list[float] | torch.Tensor) -> None:
        """Standardise dense inputs with these (training-window) statistics from now on."""
        self.dense_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.dense_std.copy_(torch.as_tensor(std, dtype=torch.float32))

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [B, 2] (click, conversion) of each row's surface heads."""
        return self.forward_with_summary(batch)[0]

    def forward_with_summary(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, 2], summary h [B, summary_dim]) in one pass."""
        inp = self.embed(batch)
        h = self.trunk(inp)
        return self.head_logits(h, batch.surface_idx, inp.wide, batch.sparse, inp.cross), h

    # -- loss -----------------------------------------------------------------------------------
    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch.label_mask & self.task_allowed[batch.surface_idx]
        with torch.autocast(logits.device.type, enabled=False):  # the loss in fp32, also when called under autocast
            bce = F.binary_cross_entropy_with_logits(logits.float(), batch.labels.float(), reduction="none")
        w = mask.float() * self.surface_w[batch.surface_idx][:, None]
        per_task = (bce * w).sum(0) / mask.float().sum(0).clamp_min(1.0)
        total = (per_task * self.task_w).sum()
        return total, {t: per_task[i].detach() for i, t in enumerate(TASKS)}

    # -- compilation ----------------------------------------------------------------------------
    def compile_dense(self, **kw: Any) -> GEM:
        """torch.compile the fixed-shape dense parts (Wukong interaction arches, summary MLP, dense
        token). The jagged index plumbing stays eager: it is cheap, and inductor's dynamic-shape
        codegen mishandles some of its ops (repeat_interleave with output_size)."""
        for block in self.blocks:
            block.interaction.compile(**kw)
        self.summary.compile(**kw)
        self.dense.compile(**kw)
        return self

    # -- bookkeeping ----------------------------------------------------------------------------
    def param_counts(self) -> dict[str, int]:
        sparse = sum(p.numel() for p in self.embedding_parameters())
        total = sum(p.numel() for p in self.parameters())
        return {"sparse": sparse, "dense": total - sparse, "total": total}

    def embedding_parameters(self) -> list[nn.Parameter]:
        """Embedding tables (row-wise Adagrad); everything else is dense (AdamW)."""
        return list(self.tables.parameters()) + list(self.wide_tables.parameters())

    def dense_parameters(self) -> list[nn.Parameter]:
        emb = {id(p) for p in self.embedding_parameters()}
        return [p for p in self.parameters() if id(p) not in emb]


def build_model(cfg: GEMConfig | dict[str, Any], device: torch.device | str | None = None) -> GEM:
    if isinstance(cfg, dict):
        cfg = GEMConfig.from_dict(cfg)
    model = GEM(cfg)
    return model.to(device) if device is not None else model
