"""In-memory synthetic batches at the model's own shapes, for benchmarks and the GPU check.

Needs torch and PyYAML only (no polars, deltalake, pyarrow or pydantic: the GPU machine has none of
them): the model config is built from assets/features.yaml, assets/surfaces.yaml and a preset of
assets/models/ read as plain YAML, with the same fields `GEMConfig.from_specs` fills.

Rows carry a learnable signal (so a bf16 run can be compared with an fp32 run after some steps):
the click logit rises when the candidate ad appears in the row's history, with a per-ad effect and a
dense-feature effect. Histories are uniform in [min_len, max_len] (default 0..seq_len: with the
`base` preset's 4 CLS tokens the attention sees sequences of 4..68, mean ~36).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gem_model.data.batch import TASKS, Batch
from gem_model.models.config import GEMConfig

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def _yaml(path: Path) -> dict[str, Any]:
    from gem_model.yaml_strict import load_yaml  # PyYAML: deliberately not pydantic (see the module doc)

    return load_yaml(path.read_text()) or {}


def preset_dims(preset: str) -> dict[str, Any]:
    """The `model:` mapping of assets/models/<preset>.yaml."""
    if not re.fullmatch(r"[a-z0-9_]+", preset):  # a name, as gem_model.config.validate_name checks (no pydantic here)
        raise ValueError(f"preset {preset!r} must match [a-z0-9_]+")
    return dict(_yaml(ASSETS / "models" / f"{preset}.yaml").get("model") or {})


def config_from_assets(preset: str = "base", overrides: dict[str, Any] | None = None) -> GEMConfig:
    """GEMConfig of `preset` with the feature and surface fields of the YAML specs (what
    `GEMConfig.from_specs` builds, without the pydantic validation of gem_model.config)."""
    feats, surfs = _yaml(ASSETS / "features.yaml"), _yaml(ASSETS / "surfaces.yaml")
    hist = feats["history"]
    tables = {f["table"]: int(f["buckets"]) for f in [*feats["sparse"], *hist["columns"]]
              if f.get("table") and f.get("buckets")}
    names = [s["name"] for s in surfs["surfaces"]]
    dims = {**preset_dims(preset), **(overrides or {})}
    return GEMConfig(**{
        **dims,
        "dense_features": [f["name"] for f in feats["dense"]],
        "sparse_features": [[f["name"], f["table"]] for f in feats["sparse"]],
        "history_columns": [[c["name"], c["source"], c.get("table") or ""] for c in hist["columns"]],
        "tables": tables,
        "surfaces": names,
        "surface_tasks": [list(s.get("tasks", TASKS)) for s in surfs["surfaces"]],
        "surface_loss_weights": {n: float((dims.get("surface_loss_weights") or {}).get(n, 1.0)) for n in names},
        "hist_max_len": int(hist["max_len"]),
    })


def synthetic_batch(cfg: GEMConfig, batch_size: int, generator: torch.Generator, *,
                    min_len: int = 0, max_len: int | None = None) -> Batch:
    """One CPU batch; history lengths uniform in [min_len, max_len] (default max: cfg.seq_len)."""
    g = generator
    hi = cfg.seq_len if max_len is None else min(max_len, cfg.seq_len)
    lengths = torch.randint(min(min_len, hi), hi + 1, (batch_size,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    total = int(offsets[-1])
    sparse = torch.stack([torch.randint(1, cfg.tables[t], (batch_size,), generator=g) for _, t in cfg.sparse_features], 1)
    history = {name: torch.rand(total, generator=g) * 1e6 + 1.0 if source == "ts"
               else torch.randint(1, cfg.tables[table], (total,), generator=g)
               for name, source, table in cfg.history_columns}
    dense = torch.randn(batch_size, len(cfg.dense_features), generator=g)
    logit = -2.0 + 0.5 * dense[:, 0]
    if cfg.target_pairs and total:  # the candidate shows up in half of the non-empty histories
        j, col = cfg.target_pairs[0]
        hit = (torch.rand(batch_size, generator=g) < 0.5) & (lengths > 0)
        history[col][(offsets[1:] - 1)[hit]] = sparse[hit, j]
        logit = logit + 1.5 * hit.float() + 0.3 * torch.cos(sparse[:, j].float())
    labels = torch.stack([torch.rand(batch_size, generator=g) < torch.sigmoid(logit),
                          torch.rand(batch_size, generator=g) < 0.3 * torch.sigmoid(logit)], 1).float()
    surface_idx = torch.randint(0, len(cfg.surfaces), (batch_size,), generator=g)
    return Batch(dense=dense, sparse=sparse, offsets=offsets, history=history, surface_idx=surface_idx,
                 labels=labels, label_mask=torch.ones(batch_size, 2, dtype=torch.bool),
                 request_ids=[f"s{i}" for i in range(batch_size)], max_len=int(lengths.max()) if batch_size else 0)


class SyntheticBatches:
    """An endless in-memory stream: `pool` batches made once (seeded), moved to `device`, cycled.
    Nothing is read from disk and no host-to-device copy happens while iterating."""

    def __init__(self, cfg: GEMConfig, batch_size: int, *, device: torch.device | str = "cpu", pool: int = 4,
                 seed: int = 0, min_len: int = 0, max_len: int | None = None):
        g = torch.Generator().manual_seed(seed)
        self.batches = [synthetic_batch(cfg, batch_size, g, min_len=min_len, max_len=max_len).to(device)
                        for _ in range(pool)]

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield from self.batches

    def mean_history(self) -> float:
        return sum(int(b.offsets[-1]) for b in self.batches) / sum(len(b) for b in self.batches)
