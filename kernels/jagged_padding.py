"""Conversions between the jagged layout and a padded batch.

The jagged layout stores ``B`` variable-length sequences back to back in one tensor
``values[L_total, ...]``; ``offsets[B + 1]`` (int32 or int64, ``offsets[0] == 0``,
non-decreasing, ``offsets[-1] == L_total``) gives sequence ``b`` as
``values[offsets[b]:offsets[b + 1]]``.  Both functions are plain PyTorch index
operations, so they are differentiable and run on any device.
"""

from __future__ import annotations

import torch

__all__ = ["jagged_to_padded", "padded_to_jagged", "jagged_positions"]


def check_offsets(offsets: torch.Tensor) -> None:
    if not isinstance(offsets, torch.Tensor):
        raise ValueError(f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dim() != 1:
        raise ValueError(f"offsets must be 1-D [B + 1], got shape {tuple(offsets.shape)}")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"offsets must be int32 or int64, got {offsets.dtype}")
    if offsets.numel() < 1:
        raise ValueError("offsets must have at least one element ([B + 1] with B >= 0)")


def jagged_positions(offsets: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(seq_id, pos)`` (int64, ``[total]``): the sequence of each jagged row and its
    position inside that sequence."""
    offsets = offsets.to(torch.int64)
    rows = torch.arange(total, device=offsets.device)
    # Row t belongs to the sequence whose end is the first one > t (empty sequences are skipped).
    seq_id = torch.searchsorted(offsets[1:].contiguous(), rows, right=True)
    pos = rows - offsets[seq_id]
    return seq_id, pos


def jagged_to_padded(
    values: torch.Tensor, offsets: torch.Tensor, max_len: int, pad_value: float = 0.0
) -> torch.Tensor:
    """Pad jagged ``values[L_total, *rest]`` into ``[B, max_len, *rest]``.

    Sequences longer than ``max_len`` are truncated (their tail is dropped); positions past a
    sequence's end hold ``pad_value``.  Differentiable with respect to ``values``.
    """
    check_offsets(offsets)
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    total = values.shape[0]
    last = int(offsets[-1])
    if last != total:
        raise ValueError(f"offsets[-1] ({last}) must equal values.shape[0] ({total})")
    batch = offsets.numel() - 1
    out = values.new_full((batch, max_len, *values.shape[1:]), pad_value)
    if total == 0 or max_len == 0:
        # Keep the graph connected so that backward works on empty inputs.
        return out + values.sum() * 0 if values.requires_grad else out
    seq_id, pos = jagged_positions(offsets.to(values.device), total)
    keep = pos < max_len
    if bool(keep.all()):
        return out.index_put((seq_id, pos), values)
    return out.index_put((seq_id[keep], pos[keep]), values[keep])


def padded_to_jagged(padded: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Gather the real rows of ``padded[B, max_len, *rest]`` into ``[L_total, *rest]``.

    ``L_total = offsets[-1]``; every sequence must fit (``length <= max_len``), else ValueError.
    Differentiable with respect to ``padded`` (padding positions get zero gradient).
    """
    check_offsets(offsets)
    if padded.dim() < 2:
        raise ValueError(f"padded must be [B, max_len, ...], got shape {tuple(padded.shape)}")
    batch = offsets.numel() - 1
    if padded.shape[0] != batch:
        raise ValueError(f"padded has batch {padded.shape[0]} but offsets describe {batch} sequences")
    offs = offsets.to(torch.int64)
    total = int(offs[-1])
    if batch > 0:
        max_len_needed = int((offs[1:] - offs[:-1]).max())
        if max_len_needed > padded.shape[1]:
            raise ValueError(
                f"a sequence of length {max_len_needed} does not fit in padded max_len {padded.shape[1]}"
            )
    seq_id, pos = jagged_positions(offs.to(padded.device), total)
    return padded[seq_id, pos]
