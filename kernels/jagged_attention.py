"""Public jagged-attention entry point: input validation and backend dispatch.

Backends: ``"triton"`` (:mod:`kernels.triton.triton_jagged_attention`), the default for CUDA
tensors in float16 / bfloat16 / float32; ``"torch"`` (:mod:`kernels.pytorch.pt_jagged_attention`),
the reference, for everything else.  ``GEM_KERNEL_BACKEND=torch|triton`` (read at every call;
unset, empty or ``auto``: the default rule) forces one; ``triton`` on CPU tensors needs
``TRITON_INTERPRET=1`` set before ``kernels`` is imported (slow; for tests), else RuntimeError.
"""

from __future__ import annotations

import math
import os

import torch

from kernels.jagged_padding import check_offsets
from kernels.pytorch.pt_jagged_attention import pytorch_jagged_attention, pytorch_jagged_attention_backward

try:  # Triton is a Linux-only dependency.
    from kernels.triton import triton_jagged_attention as _tja

    _TRITON_IMPORT_ERROR: Exception | None = None
except Exception as exc:  # pragma: no cover - depends on the platform
    _tja = None
    _TRITON_IMPORT_ERROR = exc

__all__ = ["jagged_attention", "backend_for", "SUPPORTED_HEAD_DIMS", "BACKEND_ENV"]

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
BACKEND_ENV = "GEM_KERNEL_BACKEND"
_BACKENDS = ("torch", "triton")


def _triton_unavailable_reason(t: torch.Tensor) -> str | None:
    """Why the Triton kernels cannot run on ``t`` (None if they can)."""
    if _tja is None:
        return f"triton could not be imported ({_TRITON_IMPORT_ERROR!r})"
    if t.dtype not in _tja.SUPPORTED_DTYPES:
        return f"the Triton kernels support float16, bfloat16 and float32, not {t.dtype}"
    if t.device.type == "cuda":
        return None
    if t.device.type == "cpu":
        if _tja.interpreting():
            return None
        return (
            "the tensors are on the CPU and Triton's interpreter is off: set TRITON_INTERPRET=1 "
            "before importing `kernels` to run the Triton kernels on CPU (slow, for tests), "
            f"or use {BACKEND_ENV}=torch / move the tensors to CUDA"
        )
    return f"the Triton kernels do not run on {t.device.type!r} tensors"


def backend_for(tensor: torch.Tensor) -> str:
    """Name of the backend (``"torch"`` or ``"triton"``) :func:`jagged_attention` uses for inputs
    like ``tensor``, honouring ``GEM_KERNEL_BACKEND`` (RuntimeError where a forced ``triton``
    cannot run, ValueError for an unknown value)."""
    requested = os.environ.get(BACKEND_ENV, "").strip().lower()
    if requested not in ("", "auto", *_BACKENDS):
        raise ValueError(f"{BACKEND_ENV}={requested!r} is not one of 'torch', 'triton' (or unset/'auto')")
    reason = _triton_unavailable_reason(tensor)
    if requested == "torch":
        return "torch"
    if requested == "triton":
        if reason is not None:
            raise RuntimeError(f"{BACKEND_ENV}=triton was requested but cannot be used: {reason}")
        return "triton"
    return "triton" if tensor.device.type == "cuda" and reason is None else "torch"


def _validate_tensors(q, k, v, offsets) -> None:
    """Checks that read only metadata (shapes, dtypes, devices): no host synchronisation."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [L_total, H, D], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k, v must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device, got {q.device}, {k.device}, {v.device}")
    dim = q.shape[-1]
    if dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim D={dim} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    check_offsets(offsets)


def _validate_offsets(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Check the offsets' values (reads them on the host); return them as a CPU int64 tensor."""
    offs = offsets.detach().to("cpu", torch.int64)
    if int(offs[0]) != 0:
        raise ValueError(f"offsets must start at 0, got offsets[0] = {int(offs[0])}")
    if offs.numel() > 1 and bool((offs[1:] < offs[:-1]).any()):
        bad = int(torch.nonzero(offs[1:] < offs[:-1])[0, 0])
        raise ValueError(
            f"offsets must be non-decreasing, got offsets[{bad}] = {int(offs[bad])} > "
            f"offsets[{bad + 1}] = {int(offs[bad + 1])}"
        )
    if int(offs[-1]) != total:
        raise ValueError(
            f"offsets[-1] must equal L_total = q.shape[0] = {total}, got {int(offs[-1])} "
            "(every row of q, k, v must belong to exactly one sequence)"
        )
    return offs


# ------------------------------------------------------------------------------------------------
# The custom op: opaque to torch.compile (a fake implementation gives its shapes), with autograd
# registered, so a compiled model traces through it without a graph break.


@torch.library.custom_op("gem_kernels::jagged_attention_fwd", mutates_args=())
def _attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, max_len: int, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [L, H, D], lse [L, H] fp32). The reference backend keeps no lse (its backward recomputes)."""
    if backend_for(q) == "triton":
        return _tja.triton_forward(q, k, v, offsets, max_len, causal, scale)
    out = pytorch_jagged_attention(q, k, v, offsets, causal=causal, scale=scale, max_len=max_len)
    return out, q.new_zeros(q.shape[:2], dtype=torch.float32)


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, offsets, max_len, causal, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.custom_op("gem_kernels::jagged_attention_bwd", mutates_args=())
def _attention_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    offsets: torch.Tensor, max_len: int, causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if backend_for(q) == "triton":
        return _tja.triton_backward(do, q, k, v, out, lse, offsets, max_len, causal, scale)
    return pytorch_jagged_attention_backward(do, q, k, v, offsets, causal=causal, scale=scale, max_len=max_len)


@_attention_bwd.register_fake
def _attention_bwd_fake(do, q, k, v, out, lse, offsets, max_len, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, offsets, max_len, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, offsets)
    ctx.max_len, ctx.causal, ctx.scale = max_len, causal, scale


def _backward(ctx, d_out, _d_lse):
    q, k, v, out, lse, offsets = ctx.saved_tensors
    dq, dk, dv = _attention_bwd(d_out, q, k, v, out, lse, offsets, ctx.max_len, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Multi-head softmax attention inside each sequence of a jagged batch.

    Args:
        q, k, v: ``[L_total, H, D]`` floating tensors on one device, ``D`` in {16, 32, 64, 128}.
            Rows ``offsets[b]:offsets[b + 1]`` form sequence ``b``.
        offsets: ``[B + 1]`` int32 or int64 (any device; moved to q's device), ``offsets[0] == 0``,
            non-decreasing, ``offsets[-1] == L_total`` exactly.  Zero-length sequences are allowed.
        causal: query ``i`` attends keys ``j <= i`` of its own sequence only (positions counted
            from the start of the sequence).
        scale: multiplier of ``q @ k^T``; defaults to ``1 / sqrt(D)``.
        max_len: the longest sequence (an upper bound is fine).  Given, nothing is read back from
            the device: the offsets' values are trusted (the loader computed them), which keeps a
            training step free of host synchronisation and lets ``torch.compile`` trace the call
            without a graph break.  Omitted, the offsets are copied to the host, validated, and
            ``max_len`` is computed from them.

    Returns:
        ``[L_total, H, D]`` attention output, differentiable with respect to q, k and v.

    Dtypes: q, k, v must share a dtype, except under ``torch.autocast`` for their device, where all
    three are cast to the autocast dtype (e.g. bfloat16) and the output has that dtype.  Softmax
    and accumulation run in fp32 (fp64 for float64 inputs on the reference path).  Malformed
    inputs raise ValueError (and see :func:`backend_for`).
    """
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        device_type = q.device.type
        if torch.is_autocast_enabled(device_type) and q.is_floating_point():
            dtype = torch.get_autocast_dtype(device_type)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    _validate_tensors(q, k, v, offsets)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite number, got {scale}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if max_len is None:
        offs_cpu = _validate_offsets(offsets, q.shape[0])
        max_len = int((offs_cpu[1:] - offs_cpu[:-1]).max()) if offs_cpu.numel() > 1 else 0
    elif not torch.compiler.is_compiling() and int(max_len) < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    backend_for(q)  # raises here (not inside the op) for an unknown or impossible backend
    out, _ = _attention_fwd(q, k, v, offsets.to(q.device), max_len, bool(causal), scale)
    return out
