"""Triton jagged attention: forward and backward kernels behind a ``torch.autograd.Function``.

Layout: q, k, v, out ``[L_total, H, D]`` (any strides with a unit last-dim stride), offsets
``[B + 1]``.  Every program handles one (sequence, head) pair and one block of rows:

* forward, grid ``(B * H, cdiv(max_len, BLOCK_M))``: a block of queries loops over the key blocks
  of its sequence with an online softmax (fp32, base-2 exponentials) and stores the output and the
  row logsumexp (log2 domain, fp32, ``[L_total, H]``);
* backward (FlashAttention-2's scheme): ``delta = rowsum(dO * O)``, then one kernel, grid
  ``(B * H, cdiv(max_len, BLOCK_N))``: a block of keys loops over the query blocks, recomputes P
  from the logsumexp, accumulates dK and dV in registers and adds its share of dQ = dS K to an fp32
  buffer with ``tl.atomic_add`` (5 dots per tile).  ``GEM_KERNEL_DETERMINISTIC=1`` (or
  ``torch.use_deterministic_algorithms(True)``) takes a two-pass backward instead: the same dK/dV
  kernel without dQ, then a dQ kernel over query blocks (no atomics, bitwise reproducible, 7 dots).
* short sequences (``max_len <= short_rows(D, dtype)``; ``GEM_KERNEL_SHORT_MAX``, default 128, 0 =
  off): one program per (sequence, head), grid ``(B * H,)``, the whole sequence in one tile of
  BLOCK, BLOCK/2 or BLOCK/4 rows (the one that fits it; BLOCK = the bucket of max_len): no online
  softmax, and a backward computing P once and dQ, dK, dV and delta in the same program.

Launch configs: on CUDA ``triton.autotune`` over small lists keyed by head dim, length bucket,
causal, dot precision and dtype; under ``TRITON_INTERPRET=1`` or with ``GEM_KERNEL_AUTOTUNE=0``
one heuristic config.  Accumulation is fp32; fp32 inputs use IEEE dots unless
``torch.backends.cuda.matmul.allow_tf32`` is set.  Dtypes: float16, bfloat16, float32 (bf16 is
wrong under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

__all__ = [
    "triton_forward", "triton_backward", "SUPPORTED_DTYPES", "interpreting",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634

# Test hook: when True, outputs and gradients are allocated filled with NaN instead of
# uninitialised, so a test can prove every element is written by the kernels.
POISON_OUTPUTS = False


# Triton reads TRITON_INTERPRET when @triton.jit decorates the kernels below, i.e. when this
# module is imported; changing the variable afterwards has no effect on these kernels.
_INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def interpreting() -> bool:
    """True when the kernels of this module run through Triton's CPU interpreter, i.e. when
    ``TRITON_INTERPRET=1`` was set before ``kernels`` was imported."""
    return _INTERPRET_AT_IMPORT


@triton.jit
def _sequence(OFFSETS, H, pid_bh):
    # (head, first row, length) of program pid_bh's (sequence, head) pair
    b = pid_bh // H
    h = pid_bh % H
    start = tl.load(OFFSETS + b).to(tl.int64)
    seq_len = (tl.load(OFFSETS + b + 1).to(tl.int64) - start).to(tl.int32)
    return h, start, seq_len


@triton.jit
def _ptrs(P, start, rows, stride_t, stride_h, h, offs_d):
    # [rows, D] pointers of rows start + rows of head h
    return P + (start + rows[:, None]) * stride_t + h * stride_h + offs_d[None, :]


@triton.jit
def _load(P, start, rows, stride_t, stride_h, h, offs_d, mask):
    return tl.load(_ptrs(P, start, rows, stride_t, stride_h, h, offs_d), mask=mask[:, None], other=0.0)


@triton.jit
def _store(P, start, rows, stride_t, stride_h, h, offs_d, mask, x):
    tl.store(_ptrs(P, start, rows, stride_t, stride_h, h, offs_d), x.to(P.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _jagged_attn_fwd(
    Q, K, V, OUT, LSE, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lt, stride_lh,
    H, qk_scale, len_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    # len_bucket: only the autotuning key (AUTOTUNE_KEY)
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        # Longest-running blocks (late queries) first.
        pid_m = tl.num_programs(1) - 1 - pid_m
    h, start, seq_len = _sequence(OFFSETS, H, pid_bh)
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < seq_len
    q = _load(Q, start, offs_m, stride_qt, stride_qh, h, offs_d, mask_m)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, m0 + BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        cols = n0 + offs_n
        mask_n = cols < seq_len
        k = _load(K, start, cols, stride_kt, stride_kh, h, offs_d, mask_n)
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
        v = _load(V, start, cols, stride_vt, stride_vh, h, offs_d, mask_n)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new

    acc = acc / l_i[:, None]
    _store(OUT, start, offs_m, stride_ot, stride_oh, h, offs_d, mask_m, acc)
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
    h, start, seq_len = _sequence(OFFSETS, H, pid_bh)
    n0 = pid_n * BLOCK_N
    if n0 >= seq_len:
        return

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < seq_len

    k = _load(K, start, offs_n, stride_kt, stride_kh, h, offs_d, mask_n)
    v = _load(V, start, offs_n, stride_vt, stride_vh, h, offs_d, mask_n)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo = 0
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
    for m0 in range(lo, seq_len, BLOCK_M):
        rows = m0 + offs_m
        mask_m = rows < seq_len
        q = _load(Q, start, rows, stride_qt, stride_qh, h, offs_d, mask_m)
        do = _load(DO, start, rows, stride_dot, stride_doh, h, offs_d, mask_m)
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
            tl.atomic_add(_ptrs(DQ, start, rows, stride_dqt, stride_dqh, h, offs_d), dq, mask=mask_m[:, None],
                          sem="relaxed")

    dk = dk * scale
    _store(DK, start, offs_n, stride_dkt, stride_dkh, h, offs_d, mask_n, dk)
    _store(DV, start, offs_n, stride_dvt, stride_dvh, h, offs_d, mask_n, dv)


@triton.jit
def _jagged_attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, OFFSETS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dot, stride_doh, stride_lt, stride_lh, stride_dqt, stride_dqh,
    H, qk_scale, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    h, start, seq_len = _sequence(OFFSETS, H, pid_bh)
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < seq_len

    q = _load(Q, start, offs_m, stride_qt, stride_qh, h, offs_d, mask_m)
    do = _load(DO, start, offs_m, stride_dot, stride_doh, h, offs_d, mask_m)
    lse = tl.load(LSE + (start + offs_m) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)
    delta = tl.load(DELTA + (start + offs_m) * stride_lt + h * stride_lh, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, m0 + BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        cols = n0 + offs_n
        mask_n = cols < seq_len
        k = _load(K, start, cols, stride_kt, stride_kh, h, offs_d, mask_n)
        v = _load(V, start, cols, stride_vt, stride_vh, h, offs_d, mask_n)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        valid = mask_m[:, None] & mask_n[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        p = tl.where(valid, tl.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)

    dq = dq * scale
    _store(DQ, start, offs_m, stride_dqt, stride_dqh, h, offs_d, mask_m, dq)


# ------------------------------------------------------------------------------------------------
# Short sequences: one program holds a whole (sequence, head) in one tile.  A kernel compiled for
# BLOCK rows also holds the BLOCK/2 and BLOCK/4 tiles (TILES = 3, none under 16 rows) and each
# program branches on its own sequence's length (uniform within the program: no divergence).  With
# lengths uniform in 4..68 (bucket 128) 94% of the sequences take a 32- or 64-row tile instead of
# 128: about a fifth of the dot work (it scales with the tile's area).


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
    q = _load(Q, start, offs, stride_qt, stride_qh, h, offs_d, mask)
    k = _load(K, start, offs, stride_kt, stride_kh, h, offs_d, mask)
    v = _load(V, start, offs, stride_vt, stride_vh, h, offs_d, mask)
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
    _store(OUT, start, offs, stride_ot, stride_oh, h, offs_d, mask, acc)
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
    h, start, seq_len = _sequence(OFFSETS, H, tl.program_id(0))
    if seq_len == 0:
        return
    args = (Q, K, V, OUT, LSE, start, seq_len, h, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            stride_ot, stride_oh, stride_lt, stride_lh, qk_scale)
    # constexpr TILES: a false `TILES >= n` drops its branch at compile time
    if TILES >= 3 and seq_len <= BLOCK // 4:
        _fwd_short_tile(*args, CAUSAL, BLOCK // 4, BLOCK_D, PREC)
    elif TILES >= 2 and seq_len <= BLOCK // 2:
        _fwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
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
    q = _load(Q, start, offs, stride_qt, stride_qh, h, offs_d, mask)
    k = _load(K, start, offs, stride_kt, stride_kh, h, offs_d, mask)
    v = _load(V, start, offs, stride_vt, stride_vh, h, offs_d, mask)
    do = _load(DO, start, offs, stride_dot, stride_doh, h, offs_d, mask)
    o = _load(OUT, start, offs, stride_ot, stride_oh, h, offs_d, mask)
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
    _store(DQ, start, offs, stride_dqt, stride_dqh, h, offs_d, mask, dq)
    _store(DK, start, offs, stride_dkt, stride_dkh, h, offs_d, mask, dk)
    _store(DV, start, offs, stride_dvt, stride_dvh, h, offs_d, mask, dv)


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
    h, start, seq_len = _sequence(OFFSETS, H, tl.program_id(0))
    if seq_len == 0:
        return
    args = (Q, K, V, OUT, DO, LSE, DQ, DK, DV, start, seq_len, h,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            stride_ot, stride_oh, stride_dot, stride_doh, stride_lt, stride_lh,
            stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh, qk_scale, scale)
    if TILES >= 3 and seq_len <= BLOCK // 4:
        _bwd_short_tile(*args, CAUSAL, BLOCK // 4, BLOCK_D, PREC)
    elif TILES >= 2 and seq_len <= BLOCK // 2:
        _bwd_short_tile(*args, CAUSAL, BLOCK // 2, BLOCK_D, PREC)
    else:
        _bwd_short_tile(*args, CAUSAL, BLOCK, BLOCK_D, PREC)


SHORT_MAX_ENV = "GEM_KERNEL_SHORT_MAX"
DETERMINISTIC_ENV = "GEM_KERNEL_DETERMINISTIC"
AUTOTUNE_ENV = "GEM_KERNEL_AUTOTUNE"
SHORT_TILES_ENV = "GEM_KERNEL_SHORT_TILES"


# The switches below are read at every call, so a benchmark can compare both paths.
def short_rows(dim: int, dtype: torch.dtype) -> int:
    """Longest sequence the one-tile kernels take for this head dim / dtype: at most
    ``GEM_KERNEL_SHORT_MAX`` (default 128; 0: none), and the tile (rows x D per operand, P and dP
    rows x rows) must stay in registers: 8192 elements of a 16-bit type, 4096 of fp32 (D=32 bf16:
    128 rows, the model's 68 fit; D=128 fp32: 32 rows)."""
    cap = int(os.environ.get(SHORT_MAX_ENV, "128"))
    budget = 4096 if dtype == torch.float32 else 8192
    return min(cap, max(16, budget // dim) if cap else 0)


def short_tiles(block: int) -> int:
    """Tile sizes a one-tile kernel of BLOCK rows holds: BLOCK, BLOCK/2, BLOCK/4, none under 16
    rows, at most ``GEM_KERNEL_SHORT_TILES`` (default 3; 1: the batch-wide BLOCK tile only)."""
    cap = max(1, min(3, int(os.environ.get(SHORT_TILES_ENV, "3"))))
    return min(cap, int(math.log2(block // 16)) + 1)


def deterministic() -> bool:
    """Two-pass tiled backward (no atomics, bitwise reproducible) when ``GEM_KERNEL_DETERMINISTIC=1``
    or ``torch.use_deterministic_algorithms(True)``."""
    flag = os.environ.get(DETERMINISTIC_ENV, "0").lower() in ("1", "true", "on", "yes")
    return flag or torch.are_deterministic_algorithms_enabled()


def autotuning() -> bool:
    """Autotuned launch configs: on CUDA unless ``GEM_KERNEL_AUTOTUNE=0`` (e.g. for the kernel
    tests, whose many shapes would each be tuned)."""
    return not interpreting() and os.environ.get(AUTOTUNE_ENV, "1").lower() not in ("0", "false", "off", "no")


def length_bucket(max_len: int) -> int:
    """The autotuning key's length: next power of two of max_len, at least 16 (the smallest
    tl.dot); every batch of the model (histories up to 68) falls in one bucket."""
    return max(16, triton.next_power_of_2(max(1, int(max_len))))


# ------------------------------------------------------------------------------------------------
# Launch configurations: `triton.autotune` picks among the small lists below (the key's dtypes are
# added by Triton) after pruning configs that cannot fit (shared memory) or waste the tile.

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


def _prune(prune, *extra):
    # Triton passes the positional arguments as named_args and the call's keywords (BLOCK_D,
    # CAUSAL, PREC, BLOCK, grid, ...) separately
    return {"early_config_prune": lambda configs, named_args, **kw: prune(configs, {**named_args, **kw}, *extra)}


def _autotuned():
    """The autotuned launchers (built lazily: only on CUDA, where they can be timed)."""
    global _AUTOTUNED
    if _AUTOTUNED is None:
        short, prune = short_configs(), _prune(prune_short)
        _AUTOTUNED = {
            "fwd": triton.autotune(_tiled_configs(FWD_CONFIGS), key=AUTOTUNE_KEY,
                                   prune_configs_by=_prune(prune_tiled, False))(_jagged_attn_fwd),
            "bwd": triton.autotune(_tiled_configs(BWD_CONFIGS), key=AUTOTUNE_KEY,
                                   prune_configs_by=_prune(prune_tiled, True),
                                   reset_to_zero=["DQ"])(_jagged_attn_bwd_dkdv),
            "fwd_short": triton.autotune(short, key=SHORT_AUTOTUNE_KEY, prune_configs_by=prune)(_jagged_attn_fwd_short),
            "bwd_short": triton.autotune(short, key=SHORT_AUTOTUNE_KEY, prune_configs_by=prune)(_jagged_attn_bwd_short),
        }
    return _AUTOTUNED


_AUTOTUNED = None


def _short_config(max_len: int, dim: int, dtype: torch.dtype, backward: bool) -> dict:
    """Heuristic config of the one-tile kernels: BLOCK = the length bucket; warps grow with the tile
    (the backward keeps P and dP live: 8 warps from 128 rows or fp32 64-row tiles)."""
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
    block_n = 32 if backward and dim > 64 else 64
    return {"BLOCK_M": 64, "BLOCK_N": block_n, "num_warps": 4 if dim <= 64 else 8, "num_stages": 2}


def _launch(name: str, kernel, grid, args, heuristic: dict, **constexprs) -> None:
    """Launch `kernel` autotuned on CUDA, else (interpreter, GEM_KERNEL_AUTOTUNE=0) with the
    heuristic config. `grid(meta)` gets the chosen block sizes."""
    if not autotuning():
        kernel[grid(heuristic)](*args, **constexprs, **heuristic)
    else:
        _autotuned()[name][grid](*args, **constexprs)


def _launch_short(name: str, kernel, batch_heads: int, args, max_len: int, backward: bool, **common) -> None:
    """Launch a one-tile kernel: grid (B * H,), BLOCK (and the tiles it holds) from max_len."""
    heuristic = _short_config(max_len, common["BLOCK_D"], args[0].dtype, backward)
    block = heuristic.pop("BLOCK")
    _launch(name, kernel, lambda meta: (batch_heads,), args, heuristic, BLOCK=block, TILES=short_tiles(block),
            **common)


def _strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """(row stride, head stride) of each tensor, flattened: the kernels' stride arguments."""
    return tuple(n for t in tensors for n in t.stride()[:2])


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
    args = (q, k, v, out, lse, offsets, *_strides(q, k, v, out, lse), heads, scale * LOG2E)
    if max_len <= short_rows(dim, q.dtype):
        _launch_short("fwd_short", _jagged_attn_fwd_short, batch * heads, args, max_len, False, **common)
    else:
        _launch("fwd", _jagged_attn_fwd, lambda meta: (batch * heads, triton.cdiv(max_len, meta["BLOCK_M"])),
                (*args, length_bucket(max_len)), _launch_config(dim, backward=False), **common)
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
        args = (q, k, v, out, do, lse, dq, dk, dv, offsets, *_strides(q, k, v, out, do, lse, dq, dk, dv),
                heads, scale * LOG2E, scale)
        _launch_short("bwd_short", _jagged_attn_bwd_short, batch * heads, args, max_len, True, **common)
        return dq, dk, dv
    delta = (do.float() * out.float()).sum(-1).contiguous()  # [L_total, H]
    assert delta.stride() == lse.stride()
    fused = not deterministic()
    # fused: dQ accumulates in fp32 (atomics), cast once at the end; two-pass: written by _bwd_dq
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if fused else _alloc(q)
    args = (q, k, v, do, lse, delta, dk, dv, dq, offsets, *_strides(q, k, v, do, lse, dk, dv, dq),
            heads, scale * LOG2E, scale, length_bucket(max_len))
    if fused:
        _launch("bwd", _jagged_attn_bwd_dkdv, lambda meta: (batch * heads, triton.cdiv(max_len, meta["BLOCK_N"])),
                args, _launch_config(dim, backward=True), FUSED_DQ=True, **common)
        return dq.to(q.dtype), dk, dv
    cfg = _launch_config(dim, backward=True)
    _jagged_attn_bwd_dkdv[(batch * heads, triton.cdiv(max_len, cfg["BLOCK_N"]))](*args, FUSED_DQ=False, **common,
                                                                                 **cfg)
    _jagged_attn_bwd_dq[(batch * heads, triton.cdiv(max_len, cfg["BLOCK_M"]))](
        q, k, v, do, lse, delta, dq, offsets, *_strides(q, k, v, do, lse, dq), heads, scale * LOG2E, scale,
        **common, **cfg)
    return dq, dk, dv


def triton_forward(q, k, v, offsets, max_len: int, causal: bool, scale: float):
    """(out, lse) of the forward kernel (no validation; ``kernels.jagged_attention`` validates)."""
    return _forward(_contig(q), _contig(k), _contig(v), offsets.contiguous(), max_len, causal, scale)


def triton_backward(do, q, k, v, out, lse, offsets, max_len: int, causal: bool, scale: float):
    """(dq, dk, dv) from the stored output and logsumexp."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    return _backward(_contig(do.to(q.dtype)), q, k, v, out, lse, offsets.contiguous(), max_len, causal, scale)
