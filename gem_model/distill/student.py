"""The vertical student: a fraction of the teacher's compute.

    sparse ids  -> one embedding token each (tables named and sized as in features.yaml, so
                   parameter sharing can copy the teacher's tables row for row)
    dense feats -> one dense token, after a LayerNorm across the row's features (`dense_inputs:
                   layer_norm`) or standardised per feature with the training rows' statistics
                   (`standardized`); `wide`: those standardised features also enter the heads linearly
    history     -> one token: mean of the embeddings of the last `hist_k` history items
                   (ids [B, hist_k], 0 = padding / null bucket; hist_k = 0: no sequence at all)
    teacher emb -> (representation arm) one token projected from the teacher's summary embedding
    X [B, n, d] -> Wukong (gem_model.models.layers.Wukong, the teacher's layer class)
                -> MLP(flatten) = h [B, hidden]
    serving head: Linear(h) -> logits [B, 2] (click, conversion), trained on labels only in the
                  aux-head arms, on labels + teacher in standard KD
    aux head:     a separate Linear(h) -> distillation logits [B, 2] (aux-head arms only)

The config is a plain dict (JSON-able): checkpoints load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gem_model.data.loader import TASKS
from gem_model.distill.config import StudentArch
from gem_model.models.layers import Wukong

STUDENT_ARCH_KEYS = tuple(StudentArch.model_fields)


def student_config(
    arch: dict[str, Any],
    *,
    features: Any,
    teacher_d_model: int,
    surface: str,
    tasks: list[str] | tuple[str, ...],
    aux_head: bool = False,
    teacher_emb_dim: int = 0,
) -> dict[str, Any]:
    """A student's full config dict from a preset's `student` section + features.yaml."""
    d = arch.get("d_model") or teacher_d_model
    hist_tables = [c.table for c in features.history.columns if c.source == "item_id" and c.table]
    return {
        **{k: arch[k] for k in STUDENT_ARCH_KEYS if k in arch},
        "d_model": int(d),
        "dense_features": [f.name for f in features.dense],
        "sparse_features": [[f.name, f.table] for f in features.sparse],
        "tables": dict(features.tables),
        "hist_column": next(c.name for c in features.history.columns if c.source == "item_id"),
        "hist_table": hist_tables[0] if hist_tables else "item",
        "surface": surface,
        "tasks": list(tasks),
        "aux_head": bool(aux_head),
        "teacher_emb_dim": int(teacher_emb_dim),
    }


class Student(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.cfg = dict(cfg)
        d = int(cfg["d_model"])
        self.hist_k = int(cfg.get("hist_k", 0))
        self.teacher_emb_dim = int(cfg.get("teacher_emb_dim", 0))
        self.tables = nn.ModuleDict({t: nn.Embedding(int(rows), d) for t, rows in cfg["tables"].items()})
        for emb in self.tables.values():
            nn.init.normal_(emb.weight, std=0.05)
        m = len(cfg["dense_features"])
        # checkpoints saved before these keys existed normalised with a LayerNorm and had no wide path
        self.dense_inputs = str(cfg.get("dense_inputs", "layer_norm"))
        if self.dense_inputs == "layer_norm":
            self.dense_ln = nn.LayerNorm(m)
        elif self.dense_inputs == "standardized":
            self.register_buffer("dense_mean", torch.zeros(m))
            self.register_buffer("dense_std", torch.ones(m))
        else:
            raise ValueError(f"dense_inputs {self.dense_inputs!r}: expected layer_norm or standardized")
        if cfg.get("wide") and self.dense_inputs != "standardized":
            raise ValueError("a wide path reads standardised dense features: set dense_inputs: standardized")
        self.dense = nn.Linear(m, d)
        n = len(cfg["sparse_features"]) + 1 + (self.hist_k > 0) + (self.teacher_emb_dim > 0)
        if self.teacher_emb_dim > 0:
            p = int(cfg.get("teacher_emb_proj", d))
            self.teacher_proj = nn.Sequential(
                nn.LayerNorm(self.teacher_emb_dim), nn.Linear(self.teacher_emb_dim, p), nn.GELU(), nn.Linear(p, d)
            )
        self.interaction = Wukong(
            n, d, int(cfg["wukong_layers"]), int(cfg["wukong_k"]), int(cfg["wukong_hidden"]), float(cfg["wukong_fm_frac"])
        )
        h = int(cfg["hidden"])
        self.trunk = nn.Sequential(nn.Linear(n * d, h), nn.GELU(), nn.Linear(h, h), nn.GELU())
        self.head = nn.Linear(h, len(TASKS))  # serving head
        nn.init.constant_(self.head.bias, -3.0)
        self.aux = nn.Linear(h, len(TASKS)) if cfg.get("aux_head") else None
        if self.aux is not None:
            nn.init.constant_(self.aux.bias, -3.0)
        # a logistic regression on the dense features beside the serving head, starting at 0: the counters'
        # log-odds reach the logit without passing the interaction stack
        self.wide = nn.Linear(m, len(TASKS), bias=False) if cfg.get("wide") else None
        if self.wide is not None:
            nn.init.zeros_(self.wide.weight)

    def set_dense_stats(self, dense: torch.Tensor) -> None:
        """Standardise dense inputs with the per-feature mean and sd of these rows from now on (a LayerNorm student
        keeps no statistics: nothing to set)."""
        if self.dense_inputs == "standardized" and len(dense) > 1:
            x = dense.float()
            self.dense_mean.copy_(x.mean(0))
            self.dense_std.copy_(x.std(0).nan_to_num(1.0).clamp_min(1e-3))

    def dense_features(self, dense: torch.Tensor) -> torch.Tensor:
        if self.dense_inputs == "layer_norm":
            return self.dense_ln(dense)
        return (dense.float() - self.dense_mean) / self.dense_std

    # -- forward: inputs (dense, sparse, hist_ids, teacher_emb), the last two None when unused ---------
    def hidden(self, dense: torch.Tensor, sparse: torch.Tensor, hist_ids: torch.Tensor | None = None,
               teacher_emb: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(trunk output h [B, hidden], the normalised dense features [B, m])."""
        tokens = [self.tables[table](sparse[:, j]) for j, (_, table) in enumerate(self.cfg["sparse_features"])]
        x_dense = self.dense_features(dense)
        tokens.append(self.dense(x_dense))
        if self.hist_k > 0:
            assert hist_ids is not None, "this student reads the last hist_k history items"
            e = self.tables[self.cfg["hist_table"]](hist_ids)  # [B, k, d]
            valid = (hist_ids != 0).to(e.dtype)[..., None]
            tokens.append((e * valid).sum(1) / valid.sum(1).clamp_min(1.0))
        if self.teacher_emb_dim > 0:
            assert teacher_emb is not None, "this student reads the teacher's summary embedding"
            tokens.append(self.teacher_proj(teacher_emb))
        x = self.interaction(torch.stack(tokens, dim=1))
        return self.trunk(x.flatten(1)), x_dense

    def serving_logits(self, h: torch.Tensor, x_dense: torch.Tensor) -> torch.Tensor:
        out = self.head(h)
        return out + self.wide(x_dense.to(out.dtype)) if self.wide is not None else out

    def forward_train(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(serving logits [B, 2], aux distillation logits [B, 2] or None)."""
        h, x_dense = self.hidden(*inputs)
        return self.serving_logits(h, x_dense), (self.aux(h) if self.aux is not None else None)

    def forward(self, *inputs: torch.Tensor | None) -> torch.Tensor:
        """Serving logits [B, 2] (click, conversion)."""
        return self.serving_logits(*self.hidden(*inputs))

    # -- bookkeeping ------------------------------------------------------------------------------
    def serving_head_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters()) + (list(self.wide.parameters()) if self.wide is not None else [])


def share_tables(student: Student, teacher: nn.Module, names: list[str] | tuple[str, ...]) -> list[str]:
    """Copy exactly the named embedding tables from `teacher.tables` (a GEM or a Student) into
    the student; returns the names copied. Shapes must match (same table sizes and d_model)."""
    for name in names:
        if name not in student.tables or name not in teacher.tables:
            raise KeyError(f"table {name!r} missing: student {sorted(student.tables)}, teacher {sorted(teacher.tables)}")
        src, dst = teacher.tables[name].weight, student.tables[name].weight
        if src.shape != dst.shape:
            raise ValueError(f"table {name!r}: teacher {tuple(src.shape)} != student {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(src.detach().to(dst.device, dst.dtype))
    return list(names)
