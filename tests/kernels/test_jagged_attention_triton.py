"""Triton jagged attention (interpreted on CPU, or on CUDA when present) vs a float64 reference.

Kernel paths: the one-tile kernels for short sequences (max_len <= GEM_KERNEL_SHORT_MAX, the
model's histories) and the tiled kernels (online softmax; a fused backward with dQ accumulated by
atomics, or the deterministic dK/dV + dQ passes) for longer ones; the `path` fixture forces one by
setting the threshold (0 = tiled everywhere) and GEM_KERNEL_DETERMINISTIC."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import make_offsets, naive_jagged_attention, random_qkv, rel_err

from kernels import jagged_attention
from kernels.jagged_attention import BACKEND_ENV
from kernels.triton import triton_jagged_attention as tja

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-3, torch.float16: 1e-2}

# Not a skip: an inherited TRITON_INTERPRET=0 on a machine without CUDA would silently drop every kernel test here.
if not (torch.cuda.is_available() or tja.interpreting()):
    raise RuntimeError("the Triton kernel tests need CUDA or TRITON_INTERPRET=1 set before kernels is imported "
                       "(tests/conftest.py sets it unless the environment already has TRITON_INTERPRET)")


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Outputs and gradients start as NaN: any element a kernel fails to write shows up. The public entry point
    (its custom op and autograd) runs the Triton backend, whatever the device."""
    monkeypatch.setattr(tja, "POISON_OUTPUTS", True)
    monkeypatch.setenv(BACKEND_ENV, "triton")


@pytest.fixture
def tiled(monkeypatch):
    monkeypatch.setenv(tja.SHORT_MAX_ENV, "0")
    monkeypatch.setenv(tja.DETERMINISTIC_ENV, "0")


@pytest.fixture(params=["short", "tiled", "two_pass"])
def path(request, monkeypatch):
    """short: one-tile kernels; tiled: fused backward (dQ by atomics); two_pass: the deterministic
    backward (dK/dV kernel, then dQ kernel)."""
    monkeypatch.setenv(tja.SHORT_MAX_ENV, "128" if request.param == "short" else "0")
    monkeypatch.setenv(tja.DETERMINISTIC_ENV, "1" if request.param == "two_pass" else "0")
    return request.param


def check_against_reference(lengths, heads, dim, causal, dtype, *, scale=None, offsets_dtype=torch.int64,
                            seed=0, tol=None):  # fmt: skip
    offsets = make_offsets(lengths, offsets_dtype, DEVICE)
    total = int(offsets[-1])
    q, k, v = (t.requires_grad_() for t in random_qkv(total, heads, dim, dtype, DEVICE, seed))
    out = jagged_attention(q, k, v, offsets, causal=causal, scale=scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert not torch.isnan(out).any(), "output has unwritten (NaN-poisoned) elements"

    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_jagged_attention(q64, k64, v64, offsets.cpu(), causal=causal, scale=scale)
    tol = tol or TOL[dtype]
    assert rel_err(out, ref) < tol
    if total == 0:
        return
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        assert g.shape == rg.shape and g.dtype == dtype
        assert not torch.isnan(g).any(), f"d{name} has unwritten (NaN-poisoned) elements"
        assert rel_err(g, rg) < tol, f"d{name} relative error {rel_err(g, rg)}"


# Lengths around the interpreter block size (16) and above it, plus 0 and 1.
_length = st.one_of(st.sampled_from([0, 1, 15, 16, 17, 33]), st.integers(0, 40))


# `tiled` only sets an environment variable: the same for every example.
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(_length, min_size=1, max_size=4),
    heads=st.integers(1, 2),
    dim=st.sampled_from([16, 32, 64]),
    causal=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16]),
)
def test_triton_matches_float64_reference(tiled, lengths, heads, dim, causal, dtype):
    check_against_reference(lengths, heads, dim, causal, dtype)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.one_of(st.sampled_from([0, 1, 16, 17, 63, 64]), st.integers(0, 64)), min_size=1, max_size=4),
    heads=st.integers(1, 2),
    dim=st.sampled_from([16, 32, 64]),
    causal=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16]),
)
def test_triton_short_path_matches_float64_reference(lengths, heads, dim, causal, dtype):
    assert max(lengths) <= tja.short_rows(dim, dtype)  # the one-tile kernels (default threshold)
    check_against_reference(lengths, heads, dim, causal, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_triton_block_boundaries_fp32(path, causal):
    # Sequences ending exactly at / just after block edges, next to each other.
    check_against_reference([16, 17, 32, 1, 0, 15, 33], 2, 32, causal, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_head_dim_128(path, dtype):
    check_against_reference([3, 18, 0], 1, 128, True, dtype)


def test_triton_int32_offsets_and_custom_scale():
    check_against_reference([5, 20, 2], 3, 16, False, torch.float32, scale=0.37, offsets_dtype=torch.int32)


def test_triton_empty_inputs():
    check_against_reference([0, 0], 2, 16, False, torch.float32)
    check_against_reference([], 2, 16, True, torch.float32)


def test_triton_strided_inputs_from_fused_qkv():
    """q, k, v sliced out of one fused projection (non-contiguous, unit last stride)."""
    lengths, heads, dim = [7, 19], 2, 16
    offsets = make_offsets(lengths, device=DEVICE)
    total = int(offsets[-1])
    qkv = torch.randn(total, heads, 3 * dim, device=DEVICE, requires_grad=True)
    q, k, v = qkv.split(dim, dim=-1)
    assert not q.is_contiguous()
    out = jagged_attention(q, k, v, offsets, causal=True)
    out.square().sum().backward()
    qkv64 = qkv.detach().double().requires_grad_()
    q64, k64, v64 = qkv64.split(dim, dim=-1)
    ref = naive_jagged_attention(q64, k64, v64, offsets.cpu(), causal=True)
    ref.square().sum().backward()
    assert rel_err(out, ref) < 1e-3
    assert rel_err(qkv.grad, qkv64.grad) < 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA setting")
def test_triton_fp32_with_tf32_allowed_stays_within_tf32_tolerance():
    """train() sets float32 matmul precision 'high' on CUDA: the kernels' fp32 dots then use TF32
    (10-bit mantissa), with a relative error still well under 1e-2 against float64."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert tja._precision(torch.float32) == "tf32"
        offsets = make_offsets([40, 7, 64, 0, 33], device=DEVICE)
        q, k, v = (t.requires_grad_() for t in random_qkv(int(offsets[-1]), 2, 32, torch.float32, DEVICE))
        out = jagged_attention(q, k, v, offsets)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = naive_jagged_attention(q64, k64, v64, offsets.cpu())
        ref_grads = torch.autograd.grad(ref.square().sum(), (q64, k64, v64))
        assert rel_err(out, ref) < 1e-2
        for g, rg in zip(grads, ref_grads, strict=True):
            assert rel_err(g, rg) < 1e-2
    finally:
        torch.set_float32_matmul_precision(before)


class _Forbidden:
    """Stands in for a kernel that must not be launched."""

    def __getitem__(self, grid):
        raise AssertionError("the two-pass dQ kernel was launched")


def test_fused_backward_is_the_default_and_skips_the_dq_pass(tiled, monkeypatch):
    """Default tiled backward: one fused kernel (dQ by atomics), never the separate dQ pass."""
    assert not tja.deterministic()
    monkeypatch.setattr(tja, "_jagged_attn_bwd_dq", _Forbidden())
    check_against_reference([40, 3, 17], 2, 32, True, torch.float32)


def test_deterministic_backward_is_two_pass_and_bitwise_reproducible(tiled, monkeypatch):
    monkeypatch.setenv(tja.DETERMINISTIC_ENV, "1")
    assert tja.deterministic()
    offsets = make_offsets([40, 3, 17], device=DEVICE)
    q, k, v = (t.requires_grad_() for t in random_qkv(int(offsets[-1]), 2, 32, torch.float32, DEVICE))
    runs = []
    for _ in range(2):
        out = jagged_attention(q, k, v, offsets, causal=True)
        runs.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    monkeypatch.setattr(tja, "_jagged_attn_bwd_dq", _Forbidden())
    with pytest.raises(AssertionError, match="dQ kernel was launched"):
        out = jagged_attention(q, k, v, offsets, causal=True)
        torch.autograd.grad(out.sum(), (q, k, v))


def test_torch_deterministic_mode_selects_the_two_pass_backward(monkeypatch):
    monkeypatch.delenv(tja.DETERMINISTIC_ENV, raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert tja.deterministic()
        torch.use_deterministic_algorithms(False)
        assert not tja.deterministic()
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="autotuning times configs on a GPU")
@pytest.mark.timeout(300)  # compiles and times every config per dtype: fp32 ran past 60 s on an H200
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_autotuned_kernels_match_reference_at_model_and_long_shapes(monkeypatch, dtype):
    """The autotuner picks among all configs (the fused backward's dQ accumulator is re-zeroed
    between timings); whatever it picks is still exact: the model's shape (one-tile kernels) and a
    long causal one (tiled, fused backward)."""
    monkeypatch.setenv(tja.AUTOTUNE_ENV, "1")
    monkeypatch.delenv(tja.SHORT_MAX_ENV, raising=False)
    monkeypatch.setenv(tja.DETERMINISTIC_ENV, "0")
    assert tja.autotuning()
    tol = {torch.bfloat16: 3e-2, torch.float32: 1e-3}[dtype]  # bf16: 8-bit mantissa operands
    check_against_reference([68, 4, 37, 12], 4, 32, False, dtype, tol=tol)
    check_against_reference([300, 17, 129], 2, 64, True, dtype, tol=tol)


@pytest.mark.parametrize("tiles", ["1", "3"])
@pytest.mark.parametrize("causal", [False, True])
def test_short_path_per_sequence_tiles(monkeypatch, tiles, causal):
    """One-tile kernels of a 128-row bucket: each sequence takes the 32-, 64- or 128-row tile
    that fits it (TILES=3), or the batch-wide 128 tile (GEM_KERNEL_SHORT_TILES=1); lengths on
    every tile's edges."""
    monkeypatch.delenv(tja.SHORT_MAX_ENV, raising=False)
    monkeypatch.setenv(tja.SHORT_TILES_ENV, tiles)
    assert tja.short_tiles(128) == int(tiles) and tja.short_tiles(32) == min(2, int(tiles))
    assert tja.short_tiles(16) == 1
    check_against_reference([100, 3, 32, 33, 64, 65, 0, 1, 128], 2, 32, causal, torch.float32)
