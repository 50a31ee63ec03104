"""Public API: input validation, backend dispatch, GEM_KERNEL_BACKEND, autocast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_helpers import make_offsets, naive_jagged_attention, random_qkv, rel_err

import kernels
from kernels import jagged_attention
from kernels.triton import triton_jagged_attention as tja

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def qkv():
    offsets = make_offsets([3, 0, 5])
    q, k, v = random_qkv(8, 2, 16, torch.float32)
    return q, k, v, offsets


@pytest.fixture
def backend_env(monkeypatch):
    def set_backend(value):
        if value is None:
            monkeypatch.delenv("GEM_KERNEL_BACKEND", raising=False)
        else:
            monkeypatch.setenv("GEM_KERNEL_BACKEND", value)

    set_backend(None)
    return set_backend


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        (torch.tensor([[0, 8]]), "1-D"),
        (torch.tensor([1, 8]), "start at 0"),
        (torch.tensor([0, 5, 3, 8]), "non-decreasing"),
        (torch.tensor([0, 3, 9]), "offsets\\[-1\\] must equal L_total"),
        (torch.tensor([0, 3, 7]), "offsets\\[-1\\] must equal L_total"),
        (torch.tensor([0.0, 8.0]), "int32 or int64"),
        (torch.tensor([0, 8], dtype=torch.int16), "int32 or int64"),
        ([0, 8], "must be a torch.Tensor"),
    ],
)
def test_offsets_validation(qkv, offsets, match):
    q, k, v, _ = qkv
    with pytest.raises(ValueError, match=match):
        jagged_attention(q, k, v, offsets)


def test_tensor_validation(qkv):
    q, k, v, offsets = qkv
    with pytest.raises(ValueError, match="same shape"):
        jagged_attention(q, k[:, :1], v, offsets)
    with pytest.raises(ValueError, match="same dtype"):
        jagged_attention(q, k.double(), v, offsets)
    with pytest.raises(ValueError, match="\\[L_total, H, D\\]"):
        jagged_attention(q[:, 0], k[:, 0], v[:, 0], offsets)
    with pytest.raises(ValueError, match="head dim D=24"):
        x = torch.randn(8, 2, 24)
        jagged_attention(x, x, x, offsets)
    with pytest.raises(ValueError, match="floating-point"):
        x = torch.ones(8, 2, 16, dtype=torch.int64)
        jagged_attention(x, x, x, offsets)
    with pytest.raises(ValueError, match="same device"):
        jagged_attention(q, k.to("meta"), v, offsets)


def test_unknown_backend_env(qkv, backend_env):
    backend_env("cuda-magic")
    with pytest.raises(ValueError, match="GEM_KERNEL_BACKEND"):
        jagged_attention(*qkv)


# ---------------------------------------------------------------------------- dispatch


def test_cpu_defaults_to_reference(qkv, backend_env, monkeypatch):
    q, k, v, offsets = qkv
    assert kernels.backend_for(q) == "torch"
    monkeypatch.setattr(tja, "triton_forward", _fail)
    monkeypatch.setattr(tja, "triton_backward", _fail)
    out = jagged_attention(q, k, v, offsets, causal=True)
    assert rel_err(out, naive_jagged_attention(q, k, v, offsets, causal=True)) < 1e-5


class _OnCuda:
    """What backend_for reads of a tensor (device, dtype), on a CUDA device this machine need not have."""

    device = torch.device("cuda", 0)
    dtype = torch.float32


def test_forced_torch(backend_env):
    # on CUDA the automatic choice is Triton: the variable must override it
    assert kernels.backend_for(_OnCuda()) == "triton"
    backend_env("torch")
    assert kernels.backend_for(_OnCuda()) == "torch"


@pytest.mark.skipif(not tja.interpreting(), reason="needs TRITON_INTERPRET=1 before import")
def test_forced_triton_on_cpu_with_interpreter(qkv, backend_env, monkeypatch):
    backend_env("triton")
    q, k, v, offsets = (t.requires_grad_() if t.is_floating_point() else t for t in qkv)
    assert kernels.backend_for(q) == "triton"
    calls = []
    for name in ("triton_forward", "triton_backward"):
        real = getattr(tja, name)
        monkeypatch.setattr(tja, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    out = jagged_attention(q, k, v, offsets.to(torch.int32), scale=0.3)
    out.sum().backward()
    assert calls == ["triton_forward", "triton_backward"]
    ref = naive_jagged_attention(q, k, v, offsets, scale=0.3)
    assert rel_err(out, ref) < 1e-3
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_forced_triton_rejects_float64(backend_env):
    backend_env("triton")
    x = torch.randn(4, 1, 16, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float64"):
        jagged_attention(x, x, x, make_offsets([4]))
    backend_env(None)
    assert kernels.backend_for(x) == "torch"


def test_forced_triton_without_interpreter_raises():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(GEM_KERNEL_BACKEND="triton", CUDA_VISIBLE_DEVICES="")
    code = (
        "import torch, kernels\n"
        "x = torch.randn(4, 1, 16)\n"
        "try:\n"
        "    kernels.jagged_attention(x, x, x, torch.tensor([0, 4]))\n"
        "except RuntimeError as e:\n"
        "    print('RAISED', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "RAISED" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout, proc.stdout


def test_autocast_casts_to_common_dtype(qkv, backend_env):
    q, k, v, offsets = qkv
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = jagged_attention(q, k.bfloat16(), v, offsets)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, naive_jagged_attention(q, k, v, offsets)) < 2e-2


def test_empty_batch(backend_env):
    x = torch.randn(0, 2, 32, requires_grad=True)
    out = jagged_attention(x, x, x, torch.tensor([0]))
    assert out.shape == (0, 2, 32)
    out.sum().backward()


def _fail(*args, **kwargs):
    raise AssertionError("the Triton path must not be used here")


# ---------------------------------------------------------------------------- custom op


def test_custom_op_passes_opcheck(backend_env):
    """Fake (meta) implementation, schema and registered autograd agree with the real op."""
    offsets = make_offsets([3, 0, 5])
    q, k, v = (t.requires_grad_() for t in random_qkv(8, 2, 16, torch.float32))
    op = torch.ops.gem_kernels.jagged_attention_fwd.default
    for causal in (False, True):
        torch.library.opcheck(op, (q, k, v, offsets, 5, causal, 0.25))


@pytest.mark.parametrize("causal", [False, True])
def test_max_len_upper_bound_gives_the_same_result(qkv, backend_env, causal):
    """With max_len given nothing is read back from the device; an upper bound is as good as exact."""
    q, k, v, offsets = (t.requires_grad_() if t.is_floating_point() else t for t in qkv)
    exact = jagged_attention(q, k, v, offsets, causal=causal)
    g_exact = torch.autograd.grad(exact.square().sum(), (q, k, v))
    bound = jagged_attention(q, k, v, offsets, causal=causal, max_len=9)
    g_bound = torch.autograd.grad(bound.square().sum(), (q, k, v))
    assert rel_err(bound, exact) < 1e-6
    for a, b in zip(g_bound, g_exact, strict=True):
        assert rel_err(a, b) < 1e-6
    with pytest.raises(ValueError, match="max_len"):
        jagged_attention(q, k, v, offsets, max_len=-1)


def test_fp32_dot_precision_follows_torch_setting(monkeypatch):
    """IEEE fp32 dots unless TF32 is allowed (train() allows it on CUDA); half types are unaffected."""
    monkeypatch.setattr(tja, "interpreting", lambda: False)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert tja._precision(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert tja._precision(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)
