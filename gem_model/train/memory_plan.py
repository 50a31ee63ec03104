"""Memory plan of a preset on N GPUs: what each rank holds with row-wise sharded embedding tables and
FSDP2-sharded dense parameters (gem_model.train.sharding), against the replicated (DDP) layout.

    python -m gem_model.train.memory_plan --preset large --gpus 8 --gpu-gb 80
    python -m gem_model.train.memory_plan --preset all --gpus 64 --gpu-gb 80 --rows user=1000000000

Parameter counts come from the model itself, built on the meta device (no memory); table rows from
features.yaml (`--rows TABLE=N` plans for a production vocabulary). Bytes per rank:

- embedding rows: fp32, ceil(rows / N) per table sharded (`rows` when replicated), plus their dense
  gradient (same size as the shard) and one fp32 row-wise Adagrad accumulator per row;
- dense parameters: fp32 weights, fp32 gradients and AdamW's two fp32 moments, each 1/N under FSDP2,
  plus the largest FSDP2 unit gathered unsharded (weights + gradient) while it runs;
- activations: an estimate of what autograd keeps in bf16 for one per-rank batch of the preset's
  batch_size, every history at its maximum length (formula in `activation_bytes`), or with
  `--measure` the bytes autograd saved in one fp32 CPU forward (`measured_activation_bytes`);
- fits: total <= `--headroom` (default 0.9) x GPU memory (the rest: CUDA context, allocator slack).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import torch

from gem_model.config import ASSETS_DIR
from gem_model.data.loader import TASKS, Batch
from gem_model.models import GEM, GEMConfig
from gem_model.train.config import load_preset

FP32, BF16 = 4, 2
GB = 1e9


@dataclass
class Plan:
    preset: str
    gpus: int
    gpu_gb: float
    batch_per_rank: int
    dense_params: int
    sparse_params: int
    embedding_replicated: float  # bytes per rank, replicated layout (weights only)
    embedding_sharded: float  # bytes per rank, row-wise sharded (weights only)
    embedding_state: float  # sharded: dense gradient of the shard + row-wise Adagrad accumulators
    embedding_state_replicated: float  # the same, replicated layout
    dense_weights: float  # FSDP2 shard
    dense_grads: float
    optimizer: float  # AdamW moments of the dense shard
    unsharded_unit: float  # largest FSDP2 unit gathered (weights + grads)
    activations: float
    headroom: float

    @property
    def total(self) -> float:
        return (self.embedding_sharded + self.embedding_state + self.dense_weights + self.dense_grads
                + self.optimizer + self.unsharded_unit + self.activations)

    @property
    def total_replicated(self) -> float:
        """The DDP layout for comparison: every table and dense weight, gradient and moment on every rank."""
        return (self.embedding_replicated + self.embedding_state_replicated + self.dense_params * FP32 * 4
                + self.activations)

    @property
    def max_batch_per_rank(self) -> int:
        """The largest per-rank batch whose activations fit beside everything else."""
        per_sample = self.activations / max(1, self.batch_per_rank)
        return max(0, int((self.headroom * self.gpu_gb * GB - (self.total - self.activations)) // per_sample))

    @property
    def fits(self) -> bool:
        return self.total <= self.headroom * self.gpu_gb * GB

    def row(self) -> dict[str, Any]:
        return {
            "preset": self.preset, "gpus": self.gpus, "gpu_gb": self.gpu_gb, "batch/rank": self.batch_per_rank,
            "dense params": f"{self.dense_params / 1e6:,.1f}M", "embedding params": f"{self.sparse_params / 1e6:,.1f}M",
            "emb GB/rank replicated": _gb(self.embedding_replicated), "emb GB/rank sharded": _gb(self.embedding_sharded),
            "emb grad+Adagrad GB": _gb(self.embedding_state), "dense GB (FSDP2)": _gb(self.dense_weights),
            "dense grads GB": _gb(self.dense_grads), "AdamW GB": _gb(self.optimizer),
            "unsharded unit GB": _gb(self.unsharded_unit), "activations GB": _gb(self.activations),
            "total GB/rank": _gb(self.total), "DDP total GB/rank": _gb(self.total_replicated),
            "fits": "yes" if self.fits else "NO", "max batch/rank": f"{self.max_batch_per_rank:,}",
        }


def _gb(b: float) -> str:
    return f"{b / GB:,.3f}"


def activation_bytes(cfg: GEMConfig, batch: int) -> float:
    """bf16 activations autograd keeps for one batch (estimate, per sample then x batch):
    sequence arch per block: personalised FFN (2 + 2*ffn_mult) x L_s x d and attention q, k, v, out,
    projection 5 x L_s x d (flash-style: no L x L matrix), L_s = history + CLS tokens; interaction arch
    (Wukong) per layer: 4 x n_in x d + 2 x n_in x k + 2 x hidden; cross arch 4 x (n_sum + |S_sum|) x d;
    inputs: one token per feature and per history column entry; summary MLP and heads."""
    d, n = cfg.d_model, cfg.n_tokens
    seq = cfg.seq_len + cfg.n_cls
    n_in = n + cfg.n_seq_summary
    per_block = ((2 + 2 * cfg.ffn_mult) * seq * d + 5 * seq * d
                 + cfg.wukong_layers * (4 * n_in * d + 2 * n_in * cfg.wukong_k + 2 * cfg.wukong_hidden)
                 + 4 * (cfg.n_sum + cfg.n_seq_summary) * d)
    inputs = n * d + cfg.seq_len * d * (len(cfg.history_columns) + 1)
    summary = n_in * d + 2 * cfg.head_hidden + 2 * cfg.summary_dim
    per_sample = (cfg.n_blocks + 1) * per_block + inputs + summary  # + 1: the final cross arch, roughly
    return float(per_sample * batch * BF16)


def full_history_batch(cfg: GEMConfig, batch: int, seed: int = 0) -> Batch:
    """A batch of random ids in which every history has the maximum length (the worst case)."""
    g = torch.Generator().manual_seed(seed)
    length = cfg.seq_len
    history = {name: torch.rand(batch * length, generator=g) * 86400 + 1 if source == "ts"
               else torch.randint(1, cfg.tables[table], (batch * length,), generator=g)
               for name, source, table in cfg.history_columns}
    sparse = torch.stack([torch.randint(1, cfg.tables[t], (batch,), generator=g) for _, t in cfg.sparse_features], 1)
    return Batch(dense=torch.randn(batch, len(cfg.dense_features), generator=g), sparse=sparse,
                 offsets=torch.arange(batch + 1) * length, history=history,
                 surface_idx=torch.randint(0, len(cfg.surfaces), (batch,), generator=g),
                 labels=torch.zeros(batch, len(TASKS)), label_mask=torch.ones(batch, len(TASKS), dtype=torch.bool),
                 request_ids=[str(i) for i in range(batch)])


def measured_activation_bytes(preset: str, batch: int = 4) -> float:
    """Bytes autograd saves for backward per sample, measured: one fp32 forward of the preset's model on
    the CPU over a full-history batch, every saved tensor's storage counted once (parameters excluded).
    Builds the whole model in host memory (2.4 GB for `large`). An upper bound for a bf16 GPU step: the
    CPU attention reference keeps each sequence's L x L probabilities, which the Triton kernel does not."""
    cfg = GEMConfig.from_specs(load_preset(preset)["model"])
    model = GEM(cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    b = full_history_batch(cfg, batch)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(model(b), b)
    return sum(v for k, v in saved.items() if k not in params) / batch


def plan(preset: str, gpus: int, gpu_gb: float, *, batch_per_rank: int | None = None,
         rows: dict[str, int] | None = None, headroom: float = 0.9,
         activations_per_sample: float | None = None) -> Plan:
    if gpus < 1 or gpu_gb <= 0:
        raise ValueError("--gpus must be >= 1 and --gpu-gb > 0")
    spec = load_preset(preset)
    cfg = GEMConfig.from_specs(spec["model"])
    if rows:
        if unknown := set(rows) - set(cfg.tables):
            raise ValueError(f"unknown tables {sorted(unknown)}; known: {sorted(cfg.tables)}")
        cfg.tables = {**cfg.tables, **rows}
    with torch.device("meta"):  # shapes only: the large preset needs no memory to be counted
        model = GEM(cfg)
    tables = {id(p) for p in model.embedding_parameters()}  # what gem_model.train.sharding shards
    emb = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and id(m.weight) in tables}
    sparse = sum(m.weight.numel() for m in emb.values())
    dense = sum(p.numel() for p in model.parameters()) - sparse
    replicated = sum(m.num_embeddings * m.embedding_dim for m in emb.values()) * FP32
    shard_rows = {k: math.ceil(m.num_embeddings / gpus) for k, m in emb.items()}  # as gem_model.train.sharding
    sharded = sum(shard_rows[k] * m.embedding_dim for k, m in emb.items()) * FP32
    state = sharded + sum(shard_rows.values()) * FP32  # dense gradient of the shard + one accumulator per row
    units = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    root = dense - sum(units)
    batch = batch_per_rank or int(spec["train"].get("batch_size") or 1024)
    return Plan(
        preset=preset, gpus=gpus, gpu_gb=gpu_gb, batch_per_rank=batch, dense_params=dense, sparse_params=sparse,
        embedding_replicated=replicated, embedding_sharded=sharded, embedding_state=state,
        embedding_state_replicated=replicated + sum(m.num_embeddings for m in emb.values()) * FP32,
        dense_weights=math.ceil(dense / gpus) * FP32, dense_grads=math.ceil(dense / gpus) * FP32,
        optimizer=2 * math.ceil(dense / gpus) * FP32,
        unsharded_unit=0.0 if gpus == 1 else 2 * max(units + [root]) * FP32,
        activations=activations_per_sample * batch if activations_per_sample else activation_bytes(cfg, batch),
        headroom=headroom,
    )


def format_table(plans: list[Plan]) -> str:
    """One column per plan, one line per quantity (the quantities are many, the plans few)."""
    rows = [p.row() for p in plans]
    keys = list(rows[0])
    width = max(len(k) for k in keys)
    cols = [[str(r[k]) for k in keys] for r in rows]
    cw = [max(len(v) for v in c) for c in cols]
    lines = [f"| {k if i else '':<{width}} | " + " | ".join(f"{c[i]:>{w}}" for c, w in zip(cols, cw, strict=True)) + " |"
             for i, k in enumerate(keys)]
    lines.insert(1, f"|{'-' * (width + 2)}|" + "|".join("-" * (w + 2) for w in cw) + "|")
    return "\n".join(lines)


def _rows_arg(item: str) -> tuple[str, int]:
    name, _, value = item.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"--rows expects TABLE=N, got {item!r}")
    return name, int(float(value))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph, whole
    ap.add_argument("--preset", default="all", help="a preset of assets/models, or 'all'")
    ap.add_argument("--gpus", type=int, nargs="+", default=[8], help="one or more world sizes")
    ap.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU, GB")
    ap.add_argument("--batch-size", type=int, default=None, help="per-rank batch (default: the preset's)")
    ap.add_argument("--rows", nargs="*", type=_rows_arg, default=[], help="TABLE=N: plan for a bigger vocabulary")
    ap.add_argument("--headroom", type=float, default=0.9, help="usable fraction of GPU memory")
    ap.add_argument("--measure", action="store_true",
                    help="activations measured on the CPU (fp32 saved tensors, an upper bound) instead of estimated")
    a = ap.parse_args(argv)
    presets = sorted(p.stem for p in (ASSETS_DIR / "models").glob("*.yaml") if p.stem != "students") \
        if a.preset == "all" else [a.preset]
    measured = {p: measured_activation_bytes(p) for p in presets} if a.measure else {}
    plans = [plan(p, g, a.gpu_gb, batch_per_rank=a.batch_size, rows=dict(a.rows), headroom=a.headroom,
                  activations_per_sample=measured.get(p)) for p in presets for g in a.gpus]
    if a.measure:
        print("activations: measured (fp32 saved tensors per sample, CPU reference attention: an upper bound)")
    print(format_table(plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
