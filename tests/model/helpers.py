"""Random batches without a lake, for shape/gradient tests (torch + PyYAML only: the GPU check
runs the CUDA model tests on a machine without polars, deltalake or pydantic)."""

from __future__ import annotations

import torch

from gem_model.data.batch import Batch
from gem_model.models import GEMConfig


def make_batch(cfg: GEMConfig, lengths: list[int], seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    bsz = len(lengths)
    offsets = torch.zeros(bsz + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    total = int(offsets[-1])
    history = {}
    for name, source, table in cfg.history_columns:
        if source == "ts":
            history[name] = torch.rand(total, generator=g) * 1e5 + 1.0
        else:
            history[name] = torch.randint(1, cfg.tables[table], (total,), generator=g)
    sparse = torch.stack(
        [torch.randint(1, cfg.tables[t], (bsz,), generator=g) for _, t in cfg.sparse_features], dim=1
    )
    # make some candidates appear in their own history (target attention has something to find)
    item_pairs = cfg.target_pairs
    if item_pairs and total:
        j, col = item_pairs[0]
        for b in range(0, bsz, 2):
            if lengths[b]:
                history[col][int(offsets[b + 1]) - 1] = sparse[b, j]
    surface_idx = torch.randint(0, len(cfg.surfaces), (bsz,), generator=g)
    labels = (torch.rand(bsz, 2, generator=g) < 0.3).float()
    mask = torch.ones(bsz, 2, dtype=torch.bool)
    return Batch(
        dense=torch.randn(bsz, len(cfg.dense_features), generator=g),
        sparse=sparse,
        offsets=offsets,
        history=history,
        surface_idx=surface_idx,
        labels=labels,
        label_mask=mask,
        request_ids=[f"r{i}" for i in range(bsz)],
    )


def tiny_model_config(**over) -> GEMConfig:
    """GEMConfig.from_specs of the `tiny` preset (built from the YAML specs; equal, see test_synthetic_batches)."""
    from gem_model.models.synthetic_batches import config_from_assets

    return config_from_assets("tiny", over)
