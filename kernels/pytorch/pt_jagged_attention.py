"""Pure-PyTorch reference for jagged attention (any device, native autograd).

Pads the jagged batch to the longest sequence, runs masked softmax attention with explicit
matmuls and unpads.  Half-precision inputs are computed in float32 and cast back; float32 and
float64 are computed in their own precision.  Memory is ``O(B * H * max_len**2)``.
"""

from __future__ import annotations

import math

import torch

from kernels.jagged_padding import jagged_to_padded, padded_to_jagged

__all__ = ["pytorch_jagged_attention"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def pytorch_jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Softmax attention inside each jagged sequence; q, k, v ``[L_total, H, D]``.

    No input validation here (see :func:`kernels.jagged_attention`).  ``max_len`` is the longest
    sequence length; computed from ``offsets`` when omitted.
    """
    total, heads, dim = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    offs = offsets.to(torch.int64)
    batch = offs.numel() - 1
    if max_len is None:
        max_len = int((offs[1:] - offs[:-1]).max()) if batch > 0 else 0
    if total == 0 or max_len == 0:
        # Nothing to attend to; keep the graph connected for backward.
        return (q * 0 + k.sum() * 0 + v.sum() * 0).to(q.dtype)

    cdt = _compute_dtype(q.dtype)
    device_type = q.device.type
    with torch.autocast(device_type=device_type, enabled=False):
        qp = jagged_to_padded(q.to(cdt), offs, max_len).transpose(1, 2)  # [B, H, N, D]
        kp = jagged_to_padded(k.to(cdt), offs, max_len).transpose(1, 2)
        vp = jagged_to_padded(v.to(cdt), offs, max_len).transpose(1, 2)

        lengths = (offs[1:] - offs[:-1]).to(q.device)
        idx = torch.arange(max_len, device=q.device)
        mask = idx[None, None, :] < lengths[:, None, None]  # keys inside the sequence [B, 1, N]
        if causal:
            mask = mask & (idx[None, None, :] <= idx[None, :, None])  # [B, N, N]
        mask = mask[:, None]  # broadcast over heads

        scores = torch.matmul(qp, kp.transpose(-1, -2)) * scale
        # A finite fill keeps padded query rows (and empty sequences) NaN-free; those rows are
        # dropped by padded_to_jagged, so their values never matter.
        scores = scores.masked_fill(~mask, torch.finfo(cdt).min)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, vp).transpose(1, 2)  # [B, N, H, D]
        out = padded_to_jagged(out, offs)
    return out.to(q.dtype)
