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
                    assert max(bm, bn) <= bucket
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
