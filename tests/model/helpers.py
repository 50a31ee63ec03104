"""Random batches without a lake, for shape/gradient tests (torch + PyYAML only: the GPU check
runs the CUDA model tests on a machine without polars, deltalake or pydantic)."""

from __future__ import annotations

from unittest import mock

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


BF16_LENGTHS = [3, 0, 7, 16, 1, 5] * 16  # empty, single-item and long histories


def bf16_gradient_errors(
    device: str, *, stop_max: bool, batch_lengths: list[int] = BF16_LENGTHS
) -> dict[str, tuple[float, float]]:
    """One forward/backward of the tiny model in fp32 and under bf16 autocast on `device`, same
    weights and batch: {parameter: (|g_bf16 - g_fp32| / |g_fp32|, cosine)} for every parameter
    with a gradient. `stop_max` stops the gradient of target attention's best-match statistic
    (a hard max: on a near tie bf16 rounding moves its argmax, so its subgradient reaches a
    different history item) to show that the rest agrees within bf16 rounding."""
    import copy

    import gem_model.models.target_attention as ta
    from gem_model.models import GEM

    torch.manual_seed(0)
    cfg = tiny_model_config(n_heads=1, d_model=32)
    model = GEM(cfg).to(device)
    batch = make_batch(cfg, batch_lengths).to(device)
    ref = copy.deepcopy(model)
    hard_max = ta.segment_max
    stopped = (lambda *a, **k: hard_max(*a, **k).detach()) if stop_max else hard_max
    with mock.patch.object(ta, "segment_max", stopped):
        ref_loss, _ = ref.loss(ref(batch), batch)
        ref_loss.backward()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(batch)
        assert logits.dtype == torch.float32  # heads in fp32
        loss, _ = model.loss(logits, batch)
        loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 0.02 * ref_loss.item()
    out = {}
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if q.grad is not None and q.grad.norm() > 1e-6:
            rel = float((p.grad - q.grad).norm() / q.grad.norm())
            cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
            out[name] = (rel, float(cos))
    return out


def assert_bf16_gradients_match(device: str) -> None:
    """Under bf16 autocast every gradient is within 10% of fp32 once the hard max's gradient is
    stopped; with it, only the parameters feeding target attention's scores (q, k, the activation
    unit) may differ more, and they still point the same way (cosine > 0.95)."""
    smooth = bf16_gradient_errors(device, stop_max=True)
    assert max(rel for rel, _ in smooth.values()) < 0.1, smooth
    full = bf16_gradient_errors(device, stop_max=False)
    for name, (rel, cos) in full.items():
        feeds_scores = name.startswith("target.") and name.split(".")[2] in ("q", "k", "unit")
        assert (cos > 0.95) if feeds_scores else (rel < 0.1), (name, rel, cos)
