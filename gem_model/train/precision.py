"""Precision of a run: which autocast dtype `train.precision` / `AcceleratorResource.precision` mean.
Heads, losses and segment accumulators stay fp32 under any of them (see gem_model.models)."""

from __future__ import annotations

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """bf16 -> torch.bfloat16 (autocast on any device); fp32 -> None; auto -> bf16 on CUDA only."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision must be auto, bf16 or fp32, got {precision!r}")
    return torch.bfloat16 if precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda") else None
