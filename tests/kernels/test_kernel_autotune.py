"""Launch configurations of the Triton kernels: the autotune lists, their pruning and key (checked
here on CPU: autotuning itself needs a GPU to time on), and the CUDA launch path with a recording
stand-in for the autotuned kernels."""

from __future__ import annotations

import pytest
import torch
import triton

from kernels.triton import triton_jagged_attention as tja

DIMS = (16, 32, 64, 128)
BUCKETS = tuple(2**i for i in range(4, 14))  # 16 .. 8192
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def test_length_bucket_is_next_power_of_two_at_least_16():
    assert [tja.length_bucket(n) for n in (0, 1, 16, 17, 36, 64, 65, 68, 128, 4096, 4097)] == [
        16, 16, 16, 32, 64, 64, 128, 128, 128, 4096, 8192]  # fmt: skip


def _named(dim, bucket, dtype):
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return {"BLOCK_D": dim, "len_bucket": bucket, "PREC": prec, "Q": torch.empty(0, dtype=dtype)}


@pytest.mark.parametrize("backward", [False, True])
def test_every_pruned_config_is_valid_for_each_dim_bucket_and_dtype(backward):
    table = tja.BWD_CONFIGS if backward else tja.FWD_CONFIGS
    configs = tja._tiled_configs(table)
    for dim in DIMS:
        for bucket in BUCKETS:
            for dtype in DTYPES:
                kept = tja.prune_tiled(configs, _named(dim, bucket, dtype), backward)
                assert kept, (dim, bucket, dtype)
                elem = 4 if dtype == torch.float32 else 2
                for c in kept:
                    bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
                    assert bm >= 16 and bn >= 16 and bm == triton.next_power_of_2(bm)
                    assert bn == triton.next_power_of_2(bn)
                    assert min(32, bucket) <= max(bm, bn) <= bucket
                    assert tja.smem_bytes(bm, bn, dim, c.num_stages, elem, backward) <= tja.SMEM_BUDGET
                    assert c.num_warps in (1, 2, 4, 8)
    # long sequences keep a real choice; a 16-row bucket keeps only 16x16 blocks
    assert len(tja.prune_tiled(configs, _named(64, 4096, torch.bfloat16), backward)) >= 4
    assert {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])
            for c in tja.prune_tiled(configs, _named(32, 16, torch.bfloat16), backward)} == {(16, 16)}


def test_short_configs_keep_two_warps_for_small_tiles_only():
    configs = tja.short_configs()
    assert [c.num_warps for c in tja.prune_short(configs, {"BLOCK": 16})] == [2, 4, 8]
    assert [c.num_warps for c in tja.prune_short(configs, {"BLOCK": 128})] == [4, 8]


def test_autotuners_key_on_dim_bucket_causal_precision():
    tuned = tja._autotuned()
    for name in ("fwd", "bwd"):
        assert tuned[name].keys == tja.AUTOTUNE_KEY
        assert set(tja.AUTOTUNE_KEY) <= set(tuned[name].arg_names)
    for name in ("fwd_short", "bwd_short"):
        assert tuned[name].keys == tja.SHORT_AUTOTUNE_KEY
        assert set(tja.SHORT_AUTOTUNE_KEY) <= set(tuned[name].arg_names)
    assert len(tuned["fwd"].configs) == len(tja.FWD_CONFIGS) and len(tuned["bwd"].configs) == len(tja.BWD_CONFIGS)
    # the fused backward accumulates dQ with atomics: zeroed before every timed config and after tuning
    assert tuned["bwd"].reset_to_zero == ["DQ"]
    assert tuned["fwd"].reset_to_zero == []


class _Recorder:
    """Stands in for an autotuned kernel: records the grid it is given (for BLOCK_M/N = 32) and
    the arguments, without running anything."""

    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.name, grid({"BLOCK_M": 32, "BLOCK_N": 32}), args, kwargs))
        return launch


@pytest.mark.parametrize("max_len, short", [(68, True), (300, False)])
def test_cuda_path_launches_the_autotuned_kernels(monkeypatch, max_len, short):
    calls: list = []
    monkeypatch.setattr(tja, "interpreting", lambda: False)
    monkeypatch.setenv(tja.AUTOTUNE_ENV, "1")
    monkeypatch.setattr(tja, "_autotuned", lambda: {n: _Recorder(calls, n) for n in ("fwd", "bwd", "fwd_short",
                                                                                        "bwd_short")})
    monkeypatch.delenv(tja.DETERMINISTIC_ENV, raising=False)
    monkeypatch.delenv(tja.SHORT_MAX_ENV, raising=False)
    lengths = [max_len, 5, 0]
    offsets = torch.tensor([0, max_len, max_len + 5, max_len + 5])
    q = torch.zeros(max_len + 5, 4, 32, dtype=torch.bfloat16)
    out, lse = tja.triton_forward(q, q, q, offsets, max_len, False, 0.2)
    tja.triton_backward(out, q, q, q, out, lse, offsets, max_len, False, 0.2)
    assert [c[0] for c in calls] == (["fwd_short", "bwd_short"] if short else ["fwd", "bwd"])
    for name, grid, args, kwargs in calls:
        assert kwargs["BLOCK_D"] == 32 and kwargs["PREC"] == "tf32" and kwargs["CAUSAL"] is False
        assert "num_warps" not in kwargs and "BLOCK_M" not in kwargs  # left to the autotuner
        if short:
            assert grid == (len(lengths) * 4,) and kwargs["BLOCK"] == 128
        else:
            assert grid == (len(lengths) * 4, triton.cdiv(max_len, 32))
            fn = tja._jagged_attn_fwd if name == "fwd" else tja._jagged_attn_bwd_dkdv
            assert args[fn.arg_names.index("len_bucket")] == tja.length_bucket(max_len) == 512  # the key
    if not short:
        assert calls[1][3]["FUSED_DQ"] is True
        dq = calls[1][2][8]
        assert dq.dtype == torch.float32 and not dq.any()  # the zeroed fp32 accumulator


def test_autotune_off_on_cuda_launches_the_heuristic_configs(monkeypatch):
    """GEM_KERNEL_AUTOTUNE=0 (the kernel tests on a GPU): the plain kernels with the heuristic
    block sizes and warps, the autotuners untouched."""
    calls: list = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((self.name, grid, kwargs))

    monkeypatch.setattr(tja, "interpreting", lambda: False)
    monkeypatch.setenv(tja.AUTOTUNE_ENV, "0")
    monkeypatch.setattr(tja, "_autotuned", lambda: pytest.fail("autotuner used"))
    for name in ("_jagged_attn_fwd", "_jagged_attn_bwd_dkdv", "_jagged_attn_fwd_short", "_jagged_attn_bwd_short"):
        monkeypatch.setattr(tja, name, Kernel(name))
    assert not tja.autotuning()
    q = torch.zeros(305, 2, 64, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 300, 305])
    out, lse = tja.triton_forward(q, q, q, offsets, 300, True, 0.1)
    tja.triton_backward(out, q, q, q, out, lse, offsets, 300, True, 0.1)
    fwd, bwd = tja._launch_config(64, False), tja._launch_config(64, True)
    assert [c[0] for c in calls] == ["_jagged_attn_fwd", "_jagged_attn_bwd_dkdv"]
    assert calls[0][1] == (4, triton.cdiv(300, fwd["BLOCK_M"])) and calls[0][2]["BLOCK_M"] == fwd["BLOCK_M"]
    assert calls[1][1] == (4, triton.cdiv(300, bwd["BLOCK_N"])) and calls[1][2]["num_warps"] == bwd["num_warps"]


class _FakeJit:
    """Replaces an autotuner's kernel: records each launch's keywords (no GPU here)."""

    def __init__(self, launches):
        self.launches = launches

    def run(self, *args, **kwargs):
        self.launches.append(kwargs)


@pytest.mark.parametrize("max_len, name", [(68, "bwd_short"), (40, "bwd")])
def test_real_autotuners_prune_key_and_reset_on_a_call(monkeypatch, max_len, name):
    """The real triton.autotune objects driven by a backward call (timings faked, the kernel
    recorded): the pruning sees the call's keywords, the cache key carries dim / bucket / causal /
    precision / dtype, and the fused backward's dQ buffer is zero again after tuning."""
    monkeypatch.setattr(tja, "interpreting", lambda: False)
    monkeypatch.setenv(tja.AUTOTUNE_ENV, "1")
    monkeypatch.delenv(tja.DETERMINISTIC_ENV, raising=False)
    monkeypatch.setenv(tja.SHORT_MAX_ENV, "128" if name == "bwd_short" else "0")
    tuner = tja._autotuned()[name]
    launches: list = []
    timed: list = []

    def fake_bench(*args, config, **meta):
        dq = args[8] if name == "bwd" else None
        if dq is not None:
            dq.fill_(7.0)  # what a timed run leaves behind
        timed.append(config)
        return [float(len(timed)), 0.0, 0.0]  # the first config tried is the fastest

    monkeypatch.setattr(tuner, "fn", _FakeJit(launches))
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "_bench", fake_bench)
    q = torch.zeros(max_len + 5, 2, 32, dtype=torch.bfloat16)
    offsets = torch.tensor([0, max_len, max_len + 5])
    lse = torch.zeros(max_len + 5, 2)
    seen_dq = []
    if name == "bwd":
        real_zeros = torch.zeros

        def zeros(*a, **k):  # keep a handle on the fp32 dQ accumulator
            t = real_zeros(*a, **k)
            seen_dq.append(t)
            return t

        monkeypatch.setattr(tja.torch, "zeros", zeros)
    tja.triton_backward(q, q, q, q, q, lse, offsets, max_len, True, 0.1)
    (key,) = tuner.cache
    assert key[:4] == (32, 64 if name == "bwd" else 128, True, "tf32")  # D, bucket / tile, causal, precision
    assert "torch.bfloat16" in key
    if name == "bwd":  # bucket 64: 128-key blocks and 16x16 (kept for the 16 bucket only) pruned
        assert sorted((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in timed) == [(32, 32), (32, 64), (64, 64)]
        assert seen_dq[0].dtype == torch.float32 and not seen_dq[0].any()  # reset after tuning
    else:
        assert [c.num_warps for c in timed] == [4, 8]  # 2 warps pruned for a 128-row tile
    assert len(launches) == 1 and launches[0]["BLOCK_D"] == 32
