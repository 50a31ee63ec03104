"""The batch type the model consumes (torch only: importable without polars, deltalake or pydantic,
so the model's forward/backward and the GPU checks run on a machine that has none of them)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

TASKS = ("click", "conversion")


@dataclass
class Batch:
    """One batch of tensors. History is jagged: `offsets` [B+1] into flat `history[col]` [L_total].

    `max_len` (the longest history) is shape-like: the loader computes it on the host, so the model
    never reads it back from the device (no host synchronisation inside a training step). Left
    None, it is computed from `offsets` when the batch is built (free while they are on the CPU)."""

    dense: torch.Tensor  # [B, m] float32
    sparse: torch.Tensor  # [B, n] int64, already hashed into each feature's table
    offsets: torch.Tensor  # [B+1] int64, shared by every history column
    history: dict[str, torch.Tensor]  # hist_* -> [L_total] (ids int64; seconds_before float32)
    surface_idx: torch.Tensor  # [B] int64, index in surfaces.yaml order
    labels: torch.Tensor  # [B, 2] float32 (click, conversion)
    label_mask: torch.Tensor  # [B, 2] bool
    request_ids: list[str]
    max_len: int | None = None  # longest history of the batch (host-side int)

    def __post_init__(self) -> None:
        if self.max_len is None:
            lengths = self.offsets[1:] - self.offsets[:-1]
            self.max_len = int(lengths.max()) if lengths.numel() else 0

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def _map(self, fn) -> Batch:
        """fn on every tensor (those of `history` too); the rest as it is."""
        def one(v):
            if isinstance(v, dict):
                return {k: fn(t) for k, t in v.items()}
            return fn(v) if isinstance(v, torch.Tensor) else v

        return Batch(**{f.name: one(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """Page-locked copies, so that `to(cuda, non_blocking=True)` really overlaps."""
        return self._map(lambda t: t.pin_memory())
