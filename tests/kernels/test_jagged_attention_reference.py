"""PyTorch reference jagged attention vs a naive per-sequence loop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import make_offsets, naive_jagged_attention, random_qkv, rel_err

from kernels.pytorch.pt_jagged_attention import pytorch_jagged_attention


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=0, max_size=5),
    heads=st.integers(1, 3),
    dim=st.sampled_from([16, 32, 64, 128]),
    causal=st.booleans(),
)
def test_reference_matches_naive_loop_float64(lengths, heads, dim, causal):
    offsets = make_offsets(lengths)
    total = int(offsets[-1])
    q, k, v = (t.requires_grad_() for t in random_qkv(total, heads, dim, torch.float64))
    out = pytorch_jagged_attention(q, k, v, offsets, causal=causal)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = naive_jagged_attention(q2, k2, v2, offsets, causal=causal)
    assert out.shape == q.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    if total:
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), g)
        want = torch.autograd.grad(ref, (q2, k2, v2), g)
        for a, b in zip(got, want, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_low_precision_dtypes(dtype):
    offsets = make_offsets([5, 0, 23, 1])
    q, k, v = random_qkv(int(offsets[-1]), 2, 32, dtype)
    out = pytorch_jagged_attention(q, k, v, offsets, causal=True)
    assert out.dtype == dtype
    ref = naive_jagged_attention(q, k, v, offsets, causal=True)
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_reference_float32_gradients():
    offsets = make_offsets([5, 0, 23, 1, 40])
    q, k, v = (t.requires_grad_() for t in random_qkv(int(offsets[-1]), 2, 32, torch.float32))
    for causal in (False, True):
        out = pytorch_jagged_attention(q, k, v, offsets, causal=causal)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), g)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = naive_jagged_attention(q64, k64, v64, offsets, causal=causal)
        want = torch.autograd.grad(ref, (q64, k64, v64), g.double())
        assert rel_err(out, ref) < 1e-5
        for a, b in zip(got, want, strict=True):
            assert rel_err(a, b) < 1e-5


def test_reference_gradcheck_float64():
    offsets = make_offsets([3, 0, 2, 1])
    q, k, v = (t.requires_grad_() for t in random_qkv(6, 2, 16, torch.float64))
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: pytorch_jagged_attention(
                a, b, c, offsets, causal=causal, scale=0.5
            ),
            (q, k, v),
            fast_mode=True,
        )
