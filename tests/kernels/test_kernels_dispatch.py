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
    monkeypatch.setattr(tja, "triton_jagged_attention", _fail)
    out = jagged_attention(q, k, v, offsets, causal=True)
    assert rel_err(out, naive_jagged_attention(q, k, v, offsets, causal=True)) < 1e-5


def test_forced_torch(qkv, backend_env):
    backend_env("torch")
    assert kernels.backend_for(qkv[0]) == "torch"


@pytest.mark.skipif(not tja.interpreting(), reason="needs TRITON_INTERPRET=1 before import")
def test_forced_triton_on_cpu_with_interpreter(qkv, backend_env, monkeypatch):
    backend_env("triton")
    q, k, v, offsets = (t.requires_grad_() if t.is_floating_point() else t for t in qkv)
    assert kernels.backend_for(q) == "triton"
    calls = []
    real = tja.triton_jagged_attention
    monkeypatch.setattr(tja, "triton_jagged_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out = jagged_attention(q, k, v, offsets.to(torch.int32), scale=0.3)
    out.sum().backward()
    assert calls == [1]
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
