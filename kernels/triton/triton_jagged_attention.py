"""Triton jagged attention: forward and backward kernels behind a ``torch.autograd.Function``.

Layout: q, k, v, out ``[L_total, H, D]`` (any strides with a unit last-dim stride), offsets
``[B + 1]``.  Every program handles one (sequence, head) pair and one block of rows:

* forward, grid ``(B * H, cdiv(max_len, BLOCK_M))``: a block of queries loops over the key blocks
  of its own sequence with an online softmax (running max / running sum in fp32, base-2
  exponentials) and stores the output and the row logsumexp (log2 domain, fp32, ``[L_total, H]``);
* backward: ``delta = rowsum(dO * O)`` (PyTorch), then one fused kernel, grid
  ``(B * H, cdiv(max_len, BLOCK_N))`` (FlashAttention-2's scheme): a block of keys loops over the
  query blocks of its sequence, recomputes P from the stored logsumexp and dP once per tile,
  accumulates dK and dV in registers and adds its share of dQ = dS K into an fp32 buffer with
  ``tl.atomic_add`` (cast to the input dtype once at the end).  ``GEM_KERNEL_DETERMINISTIC=1`` (or
  ``torch.use_deterministic_algorithms(True)``) switches to the two-pass backward: the same dK/dV
  kernel without dQ, then a dQ kernel, grid ``(B * H, cdiv(max_len, BLOCK_M))``, in which a block of
  queries loops over the key blocks (no atomics, bitwise reproducible).

Matmuls (``tl.dot``) per (query block, key block) tile, each 2 * BLOCK_M * BLOCK_N * D FLOPs:

==========================  =====  =================================================
pass                        dots   which
==========================  =====  =================================================
forward                     2      Q K^T, P V
two-pass backward (before)  7      dK/dV: Q K^T, P^T dO, dO V^T, dS^T Q;  dQ: Q K^T, dO V^T, dS K
fused backward (default)    5      Q K^T, P^T dO, dO V^T, dS^T Q, dS K  (+ one fp32 atomic add of
                                   a BLOCK_M x D tile)
one-tile backward (short)   5      the same five, one tile per (sequence, head), no atomics
==========================  =====  =================================================

so the backward's matmul work went from 3.5x to 2.5x the forward's (FlashAttention-2's ratio);
its time was not measured (no GPU in the session that restructured it: see bench/RESULTS.md).

Launch configs: on CUDA ``triton.autotune`` over small lists (FWD_CONFIGS, BWD_CONFIGS,
SHORT_WARPS) keyed by head dim, length bucket (next power of two of max_len, >= 16), causal, dot
precision and dtype, pruned by shared memory and bucket; under ``TRITON_INTERPRET=1`` or with
``GEM_KERNEL_AUTOTUNE=0`` one heuristic config (autotuning needs a GPU to time on).

Short sequences (``max_len <= short_rows(D, dtype)``, 128 rows for the model's D=32 in bf16; the
threshold ``GEM_KERNEL_SHORT_MAX``, default 128, 0 = off) take one-tile kernels instead: one
program per (sequence, head), grid ``(B * H,)``, the forward without an online softmax and the
backward computing P once and dQ, dK, dV in the same program (5 dots, no recompute; delta is
computed in the kernel too, which saves the PyTorch launches the tiled path spends on it).  Each
program takes the tile that fits its own sequence (BLOCK, BLOCK/2 or BLOCK/4 rows, >= 16; BLOCK =
the bucket of max_len), so the many short histories of a batch do not pay for its longest one.

Programs whose block starts past their sequence's end return at once.  Accumulation is fp32;
fp32 inputs use IEEE fp32 dots unless ``torch.backends.cuda.matmul.allow_tf32`` is set.
Supported dtypes: float16, bfloat16, float32 (bf16 is wrong under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

__all__ = [
    "triton_jagged_attention", "triton_forward", "triton_backward", "TritonJaggedAttention", "SUPPORTED_DTYPES",
    "interpreting",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634

# Test hook: when True, outputs and gradients are allocated filled with NaN instead of
# uninitialised, so a test can prove every element is written by the kernels.
POISON_OUTPUTS = False


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Triton reads TRITON_INTERPRET when @triton.jit decorates the kernels below, i.e. when this
# module is imported; changing the variable afterwards has no effect on these kernels.
_INTERPRET_AT_IMPORT = _env_interpret()


def interpreting() -> bool:
    """True when the kernels of this module run through Triton's CPU interpreter, i.e. when
    ``TRITON_INTERPRET=1`` was set before ``kernels`` was imported."""
    return _INTERPRET_AT_IMPORT


@triton.jit
def _jagged_attn_fwd(
    Q, K, V, OUT, LSE, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt, stride_lh,
    H, qk_scale, len_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        # Longest-running blocks (late queries) first.
        pid_m = tl.num_programs(1) - 1 - pid_m
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < seq_len

    q_ptrs = Q + (start + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_m[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, m0 + BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        cols = n0 + offs_n
        mask_n = cols < seq_len
        k = tl.load(
            K + (start + cols[:, None]) * stride_kt + h * stride_kh + offs_d[None, :],
            mask=mask_n[:, None],
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        valid = mask_n[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # Every row (even padding rows of the block) sees key 0 in the first block, so m_new is
        # finite from the first iteration on and no (-inf) - (-inf) occurs.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + (start + cols[:, None]) * stride_vt + h * stride_vh + offs_d[None, :],
            mask=mask_n[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new

    acc = acc / l_i[:, None]
    o_ptrs = OUT + (start + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=mask_m[:, None])
    lse_ptrs = LSE + (start + offs_m) * stride_lt + h * stride_lh
    tl.store(lse_ptrs, m_i + tl.log2(l_i), mask=mask_m)


@triton.jit
def _jagged_attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_lt, stride_lh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
    H, qk_scale, scale, len_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREC: tl.constexpr, FUSED_DQ: tl.constexpr,
):  # fmt: skip
    # FUSED_DQ: DQ is an fp32 [L_total, H, D] buffer of zeros to which every key block adds its
    # share dS K (tl.atomic_add), so P and dP are computed once per tile (5 dots instead of 4 here
    # plus 3 in the dq kernel).  Otherwise DQ is unused and _jagged_attn_bwd_dq computes dQ.
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    n0 = pid_n * BLOCK_N
    if n0 >= seq_len:
        return

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < seq_len

    k = tl.load(
        K + (start + offs_n[:, None]) * stride_kt + h * stride_kh + offs_d[None, :],
        mask=mask_n[:, None],
        other=0.0,
    )
    v = tl.load(
        V + (start + offs_n[:, None]) * stride_vt + h * stride_vh + offs_d[None, :],
        mask=mask_n[:, None],
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo = 0
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
    for m0 in range(lo, seq_len, BLOCK_M):
        rows = m0 + offs_m
        mask_m = rows < seq_len
        q = tl.load(
            Q + (start + rows[:, None]) * stride_qt + h * stride_qh + offs_d[None, :],
            mask=mask_m[:, None],
            other=0.0,
        )
        do = tl.load(
            DO + (start + rows[:, None]) * stride_dot + h * stride_doh + offs_d[None, :],
            mask=mask_m[:, None],
            other=0.0,
        )
        lse = tl.load(LSE + (start + rows) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)
        delta = tl.load(DELTA + (start + rows) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)

        qk_t = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
        valid = mask_n[:, None] & mask_m[None, :]
        if CAUSAL:
            valid = valid & (offs_n[:, None] <= rows[None, :])
        p_t = tl.where(valid, tl.exp2(qk_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PREC)
        if FUSED_DQ:
            dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=PREC) * scale  # [BLOCK_M, BLOCK_D]
            tl.atomic_add(
                DQ + (start + rows[:, None]) * stride_dqt + h * stride_dqh + offs_d[None, :],
                dq,
                mask=mask_m[:, None],
                sem="relaxed",
            )

    dk = dk * scale
    tl.store(
        DK + (start + offs_n[:, None]) * stride_dkt + h * stride_dkh + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=mask_n[:, None],
    )
    tl.store(
        DV + (start + offs_n[:, None]) * stride_dvt + h * stride_dvh + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=mask_n[:, None],
    )


@triton.jit
def _jagged_attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_lt, stride_lh, stride_dqt, stride_dqh,
    H, qk_scale, scale, len_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < seq_len

    q = tl.load(
        Q + (start + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + (start + offs_m[:, None]) * stride_dot + h * stride_doh + offs_d[None, :],
        mask=mask_m[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + (start + offs_m) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)
    delta = tl.load(DELTA + (start + offs_m) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, m0 + BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        cols = n0 + offs_n
        mask_n = cols < seq_len
        k = tl.load(
            K + (start + cols[:, None]) * stride_kt + h * stride_kh + offs_d[None, :],
            mask=mask_n[:, None],
            other=0.0,
        )
        v = tl.load(
            V + (start + cols[:, None]) * stride_vt + h * stride_vh + offs_d[None, :],
            mask=mask_n[:, None],
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        valid = mask_m[:, None] & mask_n[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        p = tl.where(valid, tl.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)

    dq = dq * scale
    tl.store(
        DQ + (start + offs_m[:, None]) * stride_dqt + h * stride_dqh + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=mask_m[:, None],
    )


# ------------------------------------------------------------------------------------------------
# Short sequences (max_len <= SHORT_MAX, the model's histories): one program holds a whole
# (sequence, head) in one tile, so the forward needs no online softmax and the backward computes P
# once and all three gradients in one pass (5 dots, no recompute, no atomics), instead of a dK/dV
# kernel and a dQ kernel that each recompute QK^T and dO V^T.
#
# The tile fits the program's own sequence, not the batch's longest: a kernel compiled for BLOCK
# rows also holds the BLOCK/2 and BLOCK/4 tiles (TILES = 3, none under 16 rows) and each program
# branches on its sequence's length (uniform within the program, so no divergence).  With lengths
# uniform in 4..68 (bucket 128) 94% of the sequences take a 32- or 64-row tile instead of 128:
# about a fifth of the dot work (it scales with the tile's area).  One launch either way.


@triton.jit
def _fwd_short_tile(
    Q, K, V, OUT, LSE, start, seq_len, h,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt, stride_lh,
    qk_scale,
    CAUSAL: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, TILE)
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs < seq_len
    rows = start + offs[:, None]
    q = tl.load(Q + rows * stride_qt + h * stride_qh + offs_d[None, :], mask=mask[:, None], other=0.0)
    k = tl.load(K + rows * stride_kt + h * stride_kh + offs_d[None, :], mask=mask[:, None], other=0.0)
    v = tl.load(V + rows * stride_vt + h * stride_vh + offs_d[None, :], mask=mask[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    # Keys only: padding query rows still see key 0, so every row max is finite (no NaN).
    valid = mask[None, :]
    if CAUSAL:
        valid = valid & (offs[None, :] <= offs[:, None])
    s = tl.where(valid, s, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp2(s - m[:, None])
    l_sum = tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, input_precision=PREC) / l_sum[:, None]
    tl.store(OUT + rows * stride_ot + h * stride_oh + offs_d[None, :], acc.to(OUT.dtype.element_ty),
             mask=mask[:, None])
    tl.store(LSE + (start + offs) * stride_lt + h * stride_lh, m + tl.log2(l_sum), mask=mask)


@triton.jit
def _jagged_attn_fwd_short(
    Q, K, V, OUT, LSE, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt, stride_lh,
    H, qk_scale,
    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    if seq_len == 0:
        return
    args = (Q, K, V, OUT, LSE, start, seq_len, h, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            stride_ot, stride_oh, stride_lt, stride_lh, qk_scale)
    if TILES >= 3:
        if seq_len <= BLOCK // 4:
            _fwd_short_tile(*args, CAUSAL, BLOCK // 4, BLOCK_D, PREC)
        elif seq_len <= BLOCK // 2:
            _fwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
        else:
            _fwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)
    elif TILES == 2:
        if seq_len <= BLOCK // 2:
            _fwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
        else:
            _fwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)
    else:
        _fwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)


@triton.jit
def _bwd_short_tile(
    Q, K, V, OUT, DO, LSE, DQ, DK, DV, start, seq_len, h,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_lt, stride_lh,
    stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    qk_scale, scale,
    CAUSAL: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, TILE)
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs < seq_len
    rows = start + offs[:, None]
    q = tl.load(Q + rows * stride_qt + h * stride_qh + offs_d[None, :], mask=mask[:, None], other=0.0)
    k = tl.load(K + rows * stride_kt + h * stride_kh + offs_d[None, :], mask=mask[:, None], other=0.0)
    v = tl.load(V + rows * stride_vt + h * stride_vh + offs_d[None, :], mask=mask[:, None], other=0.0)
    do = tl.load(DO + rows * stride_dot + h * stride_doh + offs_d[None, :], mask=mask[:, None], other=0.0)
    o = tl.load(OUT + rows * stride_ot + h * stride_oh + offs_d[None, :], mask=mask[:, None], other=0.0)
    lse = tl.load(LSE + (start + offs) * stride_lt + h * stride_lh, mask=mask, other=0.0)
    # delta = rowsum(dO * O) here, not in PyTorch: the whole sequence is in this program.
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)

    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # [M, N], log2 domain
    valid = mask[:, None] & mask[None, :]
    if CAUSAL:
        valid = valid & (offs[None, :] <= offs[:, None])
    p = tl.where(valid, tl.exp2(s - lse[:, None]), 0.0)
    dv = tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, input_precision=PREC) * scale
    dk = tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC) * scale
    tl.store(DQ + rows * stride_dqt + h * stride_dqh + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=mask[:, None])
    tl.store(DK + rows * stride_dkt + h * stride_dkh + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=mask[:, None])
    tl.store(DV + rows * stride_dvt + h * stride_dvh + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=mask[:, None])


@triton.jit
def _jagged_attn_bwd_short(
    Q, K, V, OUT, DO, LSE, DQ, DK, DV, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_lt, stride_lh,
    stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    H, qk_scale, scale,
    CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    if seq_len == 0:
        return
    args = (Q, K, V, OUT, DO, LSE, DQ, DK, DV, start, seq_len, h,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            stride_ot, stride_oh, stride_dot, stride_doh, stride_lt, stride_lh,
            stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh, qk_scale, scale)
    if TILES >= 3:
        if seq_len <= BLOCK // 4:
            _bwd_short_tile(*args, CAUSAL, BLOCK // 4, BLOCK_D, PREC)
        elif seq_len <= BLOCK // 2:
            _bwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
        else:
            _bwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)
    elif TILES == 2:
        if seq_len <= BLOCK // 2:
            _bwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
        else:
            _bwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)
    else:
        _bwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)


SHORT_MAX_ENV = "GEM_KERNEL_SHORT_MAX"
DETERMINISTIC_ENV = "GEM_KERNEL_DETERMINISTIC"
AUTOTUNE_ENV = "GEM_KERNEL_AUTOTUNE"
SHORT_TILES_ENV = "GEM_KERNEL_SHORT_TILES"


def short_max() -> int:
    """Longest max_len served by the one-tile kernels (``GEM_KERNEL_SHORT_MAX``, default 128; 0
    turns them off). Read at every call, so a benchmark can compare both paths."""
    return int(os.environ.get(SHORT_MAX_ENV, "128"))


def short_rows(dim: int, dtype: torch.dtype) -> int:
    """Longest sequence the one-tile kernels take for this head dim / dtype: the tile (rows x D
    per operand, P and dP rows x rows) must stay in registers: 8192 elements of a 16-bit type,
    4096 of fp32 (D=32 bf16: 128 rows, the model's 68 fit; D=128 fp32: 32 rows)."""
    budget = 4096 if dtype == torch.float32 else 8192
    return min(short_max(), max(16, budget // dim) if short_max() else 0)


def short_tiles(block: int) -> int:
    """Tile sizes a one-tile kernel of BLOCK rows holds: BLOCK, BLOCK/2, BLOCK/4, none under 16
    rows, at most ``GEM_KERNEL_SHORT_TILES`` (default 3; 1 = every program uses the batch-wide
    BLOCK tile, as before per-sequence tiles). Read at every call."""
    cap = max(1, min(3, int(os.environ.get(SHORT_TILES_ENV, "3"))))
    return min(cap, int(math.log2(block // 16)) + 1)


def deterministic() -> bool:
    """Two-pass tiled backward (a dK/dV kernel, then a dQ kernel: no atomics, bitwise
    reproducible, 7 dots per tile instead of 5) when ``GEM_KERNEL_DETERMINISTIC=1`` or
    ``torch.use_deterministic_algorithms(True)``. Read at every call."""
    flag = os.environ.get(DETERMINISTIC_ENV, "0").lower() in ("1", "true", "on", "yes")
    return flag or torch.are_deterministic_algorithms_enabled()


def autotuning() -> bool:
    """Autotuned launch configs: on CUDA unless ``GEM_KERNEL_AUTOTUNE=0`` (the heuristic configs,
    e.g. for the kernel tests, whose many shapes would each be tuned). Read at every call."""
    return not interpreting() and os.environ.get(AUTOTUNE_ENV, "1").lower() not in ("0", "false", "off", "no")


def length_bucket(max_len: int) -> int:
    """The autotuning key's length: next power of two of max_len, at least 16 (the smallest
    tl.dot); every batch of the model (histories up to 68) falls in one bucket."""
    return max(16, triton.next_power_of_2(max(1, int(max_len))))


# ------------------------------------------------------------------------------------------------
# Launch configurations.  Under TRITON_INTERPRET (no GPU to time anything) one heuristic config
# each; on CUDA `triton.autotune` picks among the small lists below, keyed by head dim, length
# bucket, causal, dot precision and (added by Triton) the tensors' dtypes, after pruning configs
# that cannot fit (shared memory) or waste the tile (a block longer than the bucket).

AUTOTUNE_KEY = ["BLOCK_D", "len_bucket", "CAUSAL", "PREC"]
SHORT_AUTOTUNE_KEY = ["BLOCK_D", "BLOCK", "CAUSAL", "PREC", "TILES"]
SMEM_BUDGET = 160 * 1024  # bytes per program the pruning allows (H100/H200: 227 KiB)

# (BLOCK_M, BLOCK_N, num_warps, num_stages); forward: BLOCK_M queries per program, BLOCK_N keys
# per iteration; fused backward: BLOCK_N keys per program, BLOCK_M queries per iteration.
# Short lists: every config of a new key is compiled (seconds each) before it is timed.
FWD_CONFIGS = ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (32, 32, 4, 2), (16, 16, 2, 1))
BWD_CONFIGS = ((32, 64, 4, 2), (64, 64, 4, 2), (32, 128, 8, 2), (32, 32, 4, 1), (16, 16, 2, 1))
SHORT_WARPS = (2, 4, 8)


def short_configs() -> list:
    return [triton.Config({}, num_warps=w, num_stages=1) for w in SHORT_WARPS]


def _tiled_configs(table) -> list:
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in table]


def smem_bytes(block_m: int, block_n: int, dim: int, stages: int, elem: int, backward: bool) -> int:
    """Rough shared memory of one program: the pipelined operand tiles (forward: K, V per key
    block; backward: Q, dO per query block, times num_stages) plus the resident ones (Q; K, V)."""
    if backward:
        return (2 * block_m * stages + 2 * block_n) * dim * elem
    return (2 * block_n * stages + block_m) * dim * elem


def prune_tiled(configs, named_args, backward: bool) -> list:
    """Drop configs that overflow SMEM_BUDGET, whose blocks exceed the length bucket, or whose
    blocks are all shorter than min(32, bucket) (16-row blocks only for the 16 bucket); at least
    one config always remains: the smallest."""
    dim, bucket = named_args["BLOCK_D"], named_args["len_bucket"]
    elem = 4 if named_args.get("PREC") == "ieee" or named_args["Q"].dtype == torch.float32 else 2
    keep = [c for c in configs
            if smem_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], dim, c.num_stages, elem, backward) <= SMEM_BUDGET
            and min(32, bucket) <= max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= bucket]
    return keep or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def prune_short(configs, named_args) -> list:
    """2 warps only for tiles up to 32 rows (larger tiles spill registers with so few threads)."""
    keep = [c for c in configs if c.num_warps > 2 or named_args["BLOCK"] <= 32]
    return keep or list(configs)


def _prune(backward: bool):
    # Triton passes the positional arguments as named_args and the call's keywords (BLOCK_D,
    # CAUSAL, PREC, BLOCK, grid, ...) separately
    return {"early_config_prune": lambda configs, named_args, **kw: prune_tiled(configs, {**named_args, **kw},
                                                                                backward)}


def _autotuned():
    """The autotuned launchers (built lazily: only on CUDA, where they can be timed)."""
    global _AUTOTUNED
    if _AUTOTUNED is None:
        short = short_configs()
        prune = {"early_config_prune": lambda configs, named_args, **kw: prune_short(configs, {**named_args, **kw})}
        _AUTOTUNED = {
            "fwd": triton.autotune(_tiled_configs(FWD_CONFIGS), key=AUTOTUNE_KEY,
                                   prune_configs_by=_prune(False))(_jagged_attn_fwd),
            "bwd": triton.autotune(_tiled_configs(BWD_CONFIGS), key=AUTOTUNE_KEY, prune_configs_by=_prune(True),
                                   reset_to_zero=["DQ"])(_jagged_attn_bwd_dkdv),
            "fwd_short": triton.autotune(short, key=SHORT_AUTOTUNE_KEY, prune_configs_by=prune)(_jagged_attn_fwd_short),
            "bwd_short": triton.autotune(short, key=SHORT_AUTOTUNE_KEY, prune_configs_by=prune)(_jagged_attn_bwd_short),
        }
    return _AUTOTUNED


_AUTOTUNED = None


def _short_config(max_len: int, dim: int, dtype: torch.dtype, backward: bool) -> dict:
    """Heuristic (interpreter) config of the one-tile kernels: one tile of next_pow2(max_len) rows
    (at least 16, the smallest tl.dot); warps grow with the tile (the backward keeps P and dP live:
    8 warps from 128 rows or fp32 64-row tiles)."""
    block = length_bucket(max_len)
    if interpreting():
        return {"BLOCK": block, "num_warps": 1, "num_stages": 1}
    wide = block >= 128 or (backward and block >= 64 and (dtype == torch.float32 or dim >= 64))
    return {"BLOCK": block, "num_warps": 8 if wide else 4, "num_stages": 1}


def _launch_config(dim: int, backward: bool) -> dict:
    """Heuristic config of the tiled kernels: small blocks under the interpreter (speed); on GPU
    the deterministic two-pass backward's config and the one used when autotuning is off."""
    if interpreting():
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    if backward:
        block_n = 64 if dim <= 64 else 32
        return {"BLOCK_M": 64, "BLOCK_N": block_n, "num_warps": 4 if dim <= 64 else 8, "num_stages": 2}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4 if dim <= 64 else 8, "num_stages": 2}


def _launch(name: str, kernel, grid, args, heuristic: dict, **constexprs) -> None:
    """Launch `kernel` autotuned on CUDA, else (interpreter, GEM_KERNEL_AUTOTUNE=0) with the
    heuristic config. `grid(meta)` gets the chosen block sizes."""
    if not autotuning():
        kernel[grid(heuristic)](*args, **constexprs, **heuristic)
    else:
        _autotuned()[name][grid](*args, **constexprs)


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and (interpreting() or not torch.backends.cuda.matmul.allow_tf32):
        return "ieee"
    return "tf32"  # the default; only consulted for fp32 operands


def _alloc(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if POISON_OUTPUTS:
        return torch.full(like.shape, float("nan"), dtype=dtype or like.dtype, device=like.device)
    return torch.empty(like.shape, dtype=dtype or like.dtype, device=like.device)


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _forward(q, k, v, offsets, max_len, causal, scale):
    total, heads, dim = q.shape
    batch = offsets.numel() - 1
    out = _alloc(q)
    lse = _alloc(q[:, :, 0], torch.float32)
    if total == 0 or batch == 0 or max_len == 0 or heads == 0:
        return out, lse
    common = dict(CAUSAL=causal, BLOCK_D=dim, PREC=_precision(q.dtype))
    if max_len <= short_rows(dim, q.dtype):
        cfg = _short_config(max_len, dim, q.dtype, backward=False)
        _launch("fwd_short", _jagged_attn_fwd_short, lambda meta: (batch * heads,), (
            q, k, v, out, lse, offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            heads, scale * LOG2E,
        ), {k_: v_ for k_, v_ in cfg.items() if k_ != "BLOCK"}, BLOCK=cfg["BLOCK"], TILES=short_tiles(cfg["BLOCK"]),
            **common)  # fmt: skip
        return out, lse
    _launch("fwd", _jagged_attn_fwd, lambda meta: (batch * heads, triton.cdiv(max_len, meta["BLOCK_M"])), (
        q, k, v, out, lse, offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        heads, scale * LOG2E, length_bucket(max_len),
    ), _launch_config(dim, backward=False), **common)  # fmt: skip
    return out, lse


def _backward(do, q, k, v, out, lse, offsets, max_len, causal, scale):
    total, heads, dim = q.shape
    batch = offsets.numel() - 1
    dk, dv = _alloc(k), _alloc(v)
    if total == 0 or batch == 0 or max_len == 0 or heads == 0:
        return _alloc(q), dk, dv
    common = dict(CAUSAL=causal, BLOCK_D=dim, PREC=_precision(q.dtype))
    if max_len <= short_rows(dim, q.dtype):
        dq = _alloc(q)
        cfg = _short_config(max_len, dim, q.dtype, backward=True)
        _launch("bwd_short", _jagged_attn_bwd_short, lambda meta: (batch * heads,), (
            q, k, v, out, do, lse, dq, dk, dv, offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), do.stride(0), do.stride(1), lse.stride(0), lse.stride(1),
            dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            heads, scale * LOG2E, scale,
        ), {k_: v_ for k_, v_ in cfg.items() if k_ != "BLOCK"}, BLOCK=cfg["BLOCK"], TILES=short_tiles(cfg["BLOCK"]),
            **common)  # fmt: skip
        return dq, dk, dv
    delta = (do.float() * out.float()).sum(-1).contiguous()  # [L_total, H]
    assert delta.stride() == lse.stride()
    fused = not deterministic()
    # fused: dQ accumulates in fp32 (atomics), cast once at the end; two-pass: written by _bwd_dq
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if fused else _alloc(q)
    args = (
        q, k, v, do, lse, delta, dk, dv, dq, offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), lse.stride(0), lse.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dq.stride(0), dq.stride(1),
        heads, scale * LOG2E, scale, length_bucket(max_len),
    )  # fmt: skip
    if fused:
        _launch("bwd", _jagged_attn_bwd_dkdv, lambda meta: (batch * heads, triton.cdiv(max_len, meta["BLOCK_N"])),
                args, _launch_config(dim, backward=True), FUSED_DQ=True, **common)
        return dq.to(q.dtype), dk, dv
    cfg = _launch_config(dim, backward=True)
    _jagged_attn_bwd_dkdv[(batch * heads, triton.cdiv(max_len, cfg["BLOCK_N"]))](*args, FUSED_DQ=False, **common,
                                                                                 **cfg)
    _jagged_attn_bwd_dq[(batch * heads, triton.cdiv(max_len, cfg["BLOCK_M"]))](
        q, k, v, do, lse, delta, dq, offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), lse.stride(0), lse.stride(1), dq.stride(0), dq.stride(1),
        heads, scale * LOG2E, scale, length_bucket(max_len),
        **common, **cfg,
    )  # fmt: skip
    return dq, dk, dv


def triton_forward(q, k, v, offsets, max_len: int, causal: bool, scale: float):
    """(out, lse) of the forward kernel (no validation; ``kernels.jagged_attention`` validates)."""
    return _forward(_contig(q), _contig(k), _contig(v), offsets.contiguous(), max_len, causal, scale)


def triton_backward(do, q, k, v, out, lse, offsets, max_len: int, causal: bool, scale: float):
    """(dq, dk, dv) from the stored output and logsumexp."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    return _backward(_contig(do.to(q.dtype)), q, k, v, out, lse, offsets.contiguous(), max_len, causal, scale)


class TritonJaggedAttention(torch.autograd.Function):
    """Autograd wrapper: ``apply(q, k, v, offsets, max_len, causal, scale)``; grads for q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len, causal, scale):
        q, k, v = _contig(q), _contig(k), _contig(v)
        offsets = offsets.contiguous()
        out, lse = _forward(q, k, v, offsets, max_len, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse, offsets)
        ctx.max_len, ctx.causal, ctx.scale = max_len, causal, scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, offsets = ctx.saved_tensors
        do = _contig(do.to(q.dtype))
        dq, dk, dv = _backward(do, q, k, v, out, lse, offsets, ctx.max_len, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None, None


def triton_jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Run the Triton kernels (no validation; see :func:`kernels.jagged_attention`)."""
    dim = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    if max_len is None:
        offs = offsets.detach().to("cpu", torch.int64)
        max_len = int((offs[1:] - offs[:-1]).max()) if offs.numel() > 1 else 0
    return TritonJaggedAttention.apply(q, k, v, offsets, int(max_len), bool(causal), float(scale))
