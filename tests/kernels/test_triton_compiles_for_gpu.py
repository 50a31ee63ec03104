"""Compile the Triton kernels for an NVIDIA target without a GPU (catches errors that the
interpreter accepts but the compiler rejects, and checks shared memory fits an H100/H200), in
every launch config the autotuner may pick for the cases below."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton import triton_jagged_attention as m

assert not m.interpreting()

def source(fn, dtype, constexprs, fp32_ptrs=("LSE", "DELTA")):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in fp32_ptrs:
            sig[name] = "*fp32"
        elif name == "OFFSETS":
            sig[name] = "*i64"
        elif name.isupper() and name != "H":
            sig[name] = "*" + dtype
        elif name in ("qk_scale", "scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    consts = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    return ASTSource(fn, sig, constexprs=consts)

import torch
target = GPUTarget("cuda", 90, 32)
TORCH = {"bf16": torch.bfloat16, "fp32": torch.float32}
SMEM_MAX = 227 * 1024  # H100 / H200 per-block shared memory

def tiled_configs(table, dim, dtype, causal, backward, bucket):
    # the autotune list as the pruning leaves it for this case, plus the heuristic config
    prec = "ieee" if dtype == "fp32" else "tf32"
    args = {"BLOCK_D": dim, "len_bucket": bucket, "PREC": prec, "Q": torch.empty(0, dtype=TORCH[dtype])}
    cfgs = [dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
            for c in m.prune_tiled(m._tiled_configs(table), args, backward)]
    heuristic = m._launch_config(dim, backward)
    return cfgs + ([heuristic] if heuristic not in cfgs else [])

def compile_one(fn, dtype, cfg, fp32_ptrs=("LSE", "DELTA")):
    cfg = dict(cfg)
    options = {"num_warps": cfg.pop("num_warps"), "num_stages": cfg.pop("num_stages")}
    kernel = triton.compile(source(fn, dtype, cfg, fp32_ptrs), target=target, options=options)
    assert kernel.metadata.shared <= SMEM_MAX, (fn.__name__, cfg, options, kernel.metadata.shared)
    print("OK", fn.__name__, dtype, cfg, options, kernel.metadata.shared)

# the model's shape (D=32 bf16: one-tile kernels, 128 rows), both ends of the tiled grid (every
# config autotuning may try at a long bucket), and the largest one-tile tile (D=64 bf16, 128 rows)
CASES = (("bf16", 32, False, (True,)), ("bf16", 64, True, (False, True)), ("fp32", 128, False, (False,)))
expected = 0
for dtype, dim, causal, paths in CASES:
    prec = "ieee" if dtype == "fp32" else "tf32"
    base = dict(CAUSAL=causal, BLOCK_D=dim, PREC=prec)
    if True in paths:  # the largest tile the one-tile path launches (its warps: code and smem alike)
        for fn, backward in ((m._jagged_attn_fwd_short, False), (m._jagged_attn_bwd_short, True)):
            cfg = m._short_config(m.short_rows(dim, TORCH[dtype]), dim, TORCH[dtype], backward)
            compile_one(fn, dtype, dict(base, TILES=m.short_tiles(cfg["BLOCK"]), **cfg))
            expected += 1
    if False in paths:
        # every config for bf16; for fp32 D=128 (slow to compile) the one of largest shared memory
        def pick(cfgs, backward):
            if dtype == "bf16":
                return cfgs
            return [max(cfgs, key=lambda c: m.smem_bytes(c["BLOCK_M"], c["BLOCK_N"], dim, c["num_stages"], 4,
                                                         backward))]
        for cfg in pick(tiled_configs(m.FWD_CONFIGS, dim, dtype, causal, False, 4096), False):
            compile_one(m._jagged_attn_fwd, dtype, dict(base, **cfg))
            expected += 1
        for cfg in pick(tiled_configs(m.BWD_CONFIGS, dim, dtype, causal, True, 4096), True):
            compile_one(m._jagged_attn_bwd_dkdv, dtype, dict(base, FUSED_DQ=True, **cfg),
                        ("LSE", "DELTA", "DQ"))
            expected += 1
        cfg = m._launch_config(dim, True)  # the deterministic two-pass backward (its dK/dV kernel is
        compile_one(m._jagged_attn_bwd_dq, dtype, dict(base, **cfg))  # the fused one minus dQ)
        expected += 1
        if dtype == "bf16":
            compile_one(m._jagged_attn_bwd_dkdv, dtype, dict(base, FUSED_DQ=False, **cfg))
            expected += 1
print("EXPECTED", expected)
"""


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 and "Cannot find ptxas" in proc.stderr:  # triton.knobs' words for a missing binary
        pytest.skip("no ptxas available to compile for an NVIDIA target")
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = int(proc.stdout.rsplit("EXPECTED", 1)[1])
    assert expected >= 15 and proc.stdout.count("OK ") == expected, proc.stdout
