"""Pure-PyTorch reference for jagged attention (any device, native autograd).

Pads the jagged batch to the longest sequence, runs ``F.scaled_dot_product_attention`` with a
boolean sequence mask and unpads.  Half-precision inputs are computed in float32 and cast back; float32 and
float64 are computed in their own precision.  Memory is ``O(B * H * max_len**2)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.jagged_padding import jagged_to_padded, padded_to_jagged

__all__ = ["pytorch_jagged_attention", "pytorch_jagged_attention_backward"]


def _padded(tensors: list[torch.Tensor], offs: torch.Tensor, max_len: int) -> tuple[torch.Tensor, ...]:
    """[B, H, N, D] views of jagged [L_total, H, D] tensors, padded in one go, in the compute dtype
    (float64 for float64, else float32)."""
    cdt = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    padded = jagged_to_padded(torch.stack([t.to(cdt) for t in tensors], dim=1), offs, max_len)
    return padded.permute(2, 0, 3, 1, 4).unbind(0)


def _key_mask(offs: torch.Tensor, max_len: int, device: torch.device) -> torch.Tensor:
    """[B, 1, 1, N], True = attend; empty sequences attend to everything so that no row is fully
    masked (no NaN)."""
    lengths = (offs[1:] - offs[:-1]).to(device)
    idx = torch.arange(max_len, device=device)
    return ((idx[None, :] < lengths[:, None]) | (lengths[:, None] == 0))[:, None, None, :]


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
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    offs = offsets.to(torch.int64)
    batch = offs.numel() - 1
    if max_len is None:
        max_len = int((offs[1:] - offs[:-1]).max()) if batch > 0 else 0
    if total == 0 or max_len == 0:
        # Nothing to attend to; keep the graph connected for backward.
        return (q * 0 + k.sum() * 0 + v.sum() * 0).to(q.dtype)

    with torch.autocast(device_type=q.device.type, enabled=False):
        qp, kp, vp = _padded([q, k, v], offs, max_len)
        # With right padding the causal mask alone hides padded keys from every real query.
        mask = None if causal else _key_mask(offs, max_len, q.device)
        # Padding query rows get finite outputs that padded_to_jagged drops; their gradient is
        # zero, so they add exactly nothing to dk / dv.
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=scale)
        out = padded_to_jagged(out.transpose(1, 2), offs)  # [L_total, H, D]
    return out.to(q.dtype)


def pytorch_jagged_attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of :func:`pytorch_jagged_attention` in closed form (the custom op's reference
    backward: it runs below autograd, so it cannot differentiate the forward; ``torch.func.vjp``
    could, but breaks under dispatch modes such as FlopCounterMode).  Padded, like the forward:
    ``P = softmax(S)``, ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``."""
    total, heads, dim = q.shape
    if total == 0 or max_len == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    offs = offsets.to(torch.int64)
    with torch.autocast(device_type=q.device.type, enabled=False):
        qp, kp, vp, dop = _padded([q, k, v, do], offs, max_len)
        keep = _key_mask(offs, max_len, q.device)
        if causal:
            idx = torch.arange(max_len, device=q.device)
            keep = keep & (idx[None, :] <= idx[:, None])[None, None]
        p = torch.softmax((qp @ kp.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf")), dim=-1)
        dv = p.transpose(-1, -2) @ dop
        dp = dop @ vp.transpose(-1, -2)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))  # padded query rows have dO = 0: ds = 0
        dq, dk = ds @ kp * scale, ds.transpose(-1, -2) @ qp * scale
        grads = [padded_to_jagged(g.transpose(1, 2), offs).to(q.dtype) for g in (dq, dk, dv)]
    return grads[0], grads[1], grads[2]
