"""Helpers shared by the kernel tests (float64 naive reference, error metric, inputs)."""

from __future__ import annotations

import math

import torch


def make_offsets(lengths, dtype=torch.int64, device="cpu") -> torch.Tensor:
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + int(n))
    return torch.tensor(offs, dtype=dtype, device=device)


def naive_jagged_attention(q, k, v, offsets, causal=False, scale=None):
    """Per-sequence loop in float64: the ground truth."""
    dim = q.shape[-1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    outs = []
    offs = offsets.tolist()
    for b in range(len(offs) - 1):
        s, e = offs[b], offs[b + 1]
        if e == s:
            continue
        qs, ks, vs = (t[s:e].double().transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        scores = qs @ ks.transpose(-1, -2) * scale
        if causal:
            n = e - s
            keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
    if not outs:
        return q.double() * 0
    return torch.cat(outs, 0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double()
    diff = (out.detach().double() - ref).norm().item()
    denom = ref.norm().item()
    if denom == 0.0:
        return diff
    return diff / denom


def random_qkv(total, heads, dim, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(total, heads, dim, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        for _ in range(3)
    ]
