"""bf16: every jagged/segment layer is dtype-explicit (fp32 accumulation whatever dtypes arrive), the
heads and the loss run in fp32, and a training run + validation pass work under bf16 autocast.

CPU autocast does not reproduce the CUDA crash (CUDA autocast runs `exp` in fp32, CPU autocast in
bf16), so the layers are also called with mixed bf16/fp32 inputs directly and compared with fp32."""

from __future__ import annotations

import pytest
import torch

from gem_model.models import GEM
from gem_model.models.layers import (
    PMA,
    CrossArch,
    segment_ids,
    segment_max,
    segment_softmax,
    segment_sum,
)
from gem_model.models.target_attention import DINTargetAttention
from gem_model.train.loop import train
from gem_model.train.precision import autocast_dtype
from tests.model.conftest import tiny_config
from tests.model.helpers import assert_bf16_gradients_match, make_batch, tiny_model_config

BF16 = torch.bfloat16
CPU_BF16 = {"device_type": "cpu", "dtype": BF16}


def _jagged(lengths: list[int], d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    total = int(offsets[-1])
    return torch.randn(total, d, generator=g), offsets, segment_ids(offsets, total)


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float = 3e-2) -> None:
    """bf16 has 8 mantissa bits: compare with a tolerance relative to the reference's scale."""
    assert torch.isfinite(got).all()
    err = (got.float() - ref.float()).abs().max().item()
    assert err <= rel * max(1.0, ref.float().abs().max().item()), err


LENGTHS = [3, 0, 7, 1, 12]


def test_segment_softmax_bf16_scores_match_fp32():
    scores, _, seg = _jagged(LENGTHS, 3)
    scores = scores * 4
    ref = segment_softmax(scores, seg, len(LENGTHS))
    got = segment_softmax(scores.to(BF16), seg, len(LENGTHS))
    assert got.dtype == BF16  # cast back once, to the scores' dtype
    _close(got, ref, 1e-2)
    sums = torch.zeros(len(LENGTHS), 3).index_add(0, seg, got.float())
    assert torch.allclose(sums[torch.tensor(LENGTHS) > 0], torch.ones(4, 3), atol=2e-2)


@pytest.mark.parametrize("w_dtype,v_dtype", [(torch.float32, BF16), (BF16, torch.float32), (BF16, BF16)])
def test_segment_sum_mixed_dtypes_accumulate_in_fp32(w_dtype, v_dtype):
    """The crash was index_add_ of an fp32 source (weights from fp32 exp) into a bf16 destination."""
    values, _, seg = _jagged(LENGTHS, 8)
    w = torch.rand(values.shape[0], 1)
    ref = segment_sum(values, seg, len(LENGTHS), weights=w)
    got = segment_sum(values.to(v_dtype), seg, len(LENGTHS), weights=w.to(w_dtype))
    assert got.dtype == v_dtype
    _close(got, ref)
    as_fp32 = segment_sum(values.to(v_dtype), seg, len(LENGTHS), weights=w.to(w_dtype), out_dtype=torch.float32)
    assert as_fp32.dtype == torch.float32
    _close(as_fp32, ref)


def test_segment_max_bf16_matches_fp32_and_empty_is_floor():
    values, _, seg = _jagged(LENGTHS, 1)
    ref = segment_max(values[:, 0], seg, len(LENGTHS))
    got = segment_max(values[:, 0].to(BF16), seg, len(LENGTHS))
    _close(got, ref, 1e-2)
    assert float(got[1]) == 0.0  # the empty row


def _modules(d: int):
    torch.manual_seed(0)
    return {
        "pma": PMA(d, n_seeds=2, n_heads=1, cond_dim=2 * d),
        "target": DINTargetAttention(d, max_len=16),
        "cross": CrossArch(5, d, n_sum=2, n_cls=1, n_pma=2, n_recent=3, n_heads=1),
    }


def _call(name: str, m: torch.nn.Module, values, offsets, seg, cond, x, cand):
    hist_len = (offsets[1:] - offsets[:-1] - 1).clamp_min(0)
    if name == "pma":
        return [m(values, seg, cond)]
    if name == "target":
        return list(m(cand, values, values, seg))
    return list(m(x, values, offsets, seg, hist_len))


# bf16 weights only for PMA: CPU layer_norm rejects bf16 weights with fp32 inputs (autocast never
# makes bf16 weights; the segment functions above cover bf16 weights with fp32 values).
MODULE_CASES = [(n, m) for n in ("pma", "target", "cross") for m in ("bf16_inputs_fp32_weights", "mixed_inputs")]


@pytest.mark.parametrize("name,mode", [*MODULE_CASES, ("pma", "fp32_inputs_bf16_weights")])
def test_segment_modules_mixed_dtypes_match_fp32(name, mode):
    d = 16
    lengths = [2, 1, 8, 1, 13]  # every sequence holds its CLS token (CrossArch reads it)
    values, offsets, seg = _jagged(lengths, d)
    g = torch.Generator().manual_seed(1)
    cond, x, cand = torch.randn(5, 2 * d, generator=g), torch.randn(5, 5, d, generator=g), torch.randn(5, d, generator=g)
    m = _modules(d)[name]
    with torch.no_grad():
        ref = _call(name, m, values, offsets, seg, cond, x, cand)
        if mode == "fp32_inputs_bf16_weights":
            m = m.to(BF16)
        elif mode == "bf16_inputs_fp32_weights":
            values, cond, x, cand = values.to(BF16), cond.to(BF16), x.to(BF16), cand.to(BF16)
        else:  # bf16 sequence values next to fp32 candidates / conditions (what autocast hands over)
            values = values.to(BF16)
        with torch.autocast(**CPU_BF16):
            got = _call(name, m, values, offsets, seg, cond, x, cand)
    for g_, r in zip(got, ref, strict=True):
        assert g_.shape == r.shape
        _close(g_, r, 6e-2)


def test_heads_and_loss_are_fp32_under_autocast():
    cfg = tiny_model_config()
    torch.manual_seed(0)
    model = GEM(cfg)
    batch = make_batch(cfg, [3, 0, 7, 16, 1, 5])
    with torch.no_grad():
        ref = model(batch)
    with torch.autocast(**CPU_BF16):
        logits = model(batch)
        loss, parts = model.loss(logits, batch)
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in parts.values())
    _close(logits.detach(), ref, 5e-2)
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_autocast_dtype_follows_precision():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("auto", cuda) is BF16
    assert autocast_dtype("bf16", cpu) is BF16 and autocast_dtype("fp32", cuda) is None
    with pytest.raises(ValueError, match="precision"):
        autocast_dtype("fp16", cpu)


def test_bf16_autocast_gradients_match_fp32_on_cpu():
    """The whole model's gradients under CPU bf16 autocast against fp32 (test_cuda.py: on CUDA)."""
    assert_bf16_gradients_match("cpu")


@pytest.mark.timeout(300)
def test_training_and_validation_under_bf16_autocast(lake, tmp_path):
    """train() with precision bf16 on CPU: every step and the validation pass run under autocast;
    the loss stays close to the fp32 run's (same seed, same batches)."""
    runs = {}
    for precision in ("bf16", "fp32"):
        cfg = tiny_config(tmp_path / precision, max_steps=12, log_every=4, precision=precision)
        cfg["data"]["eval"] = None
        runs[precision] = train(cfg)
    bf, fp = runs["bf16"], runs["fp32"]
    assert bf["loss_curve"] != fp["loss_curve"]  # precision honoured: autocast changed the numerics
    assert bf["valid_rows"] and bf["best_valid_score"] < 1.5
    for (s1, l1), (s2, l2) in zip(bf["loss_curve"], fp["loss_curve"], strict=True):
        assert s1 == s2 and abs(l1 - l2) <= 0.05 * l2, (l1, l2)
    assert abs(bf["best_valid_score"] - fp["best_valid_score"]) < 0.05


def test_accelerator_precision_reaches_train_config():
    """AcceleratorResource.precision (bf16 | fp32) becomes train.precision on CUDA; the CPU trains in fp32."""
    from gem_pipelines.resources import AcceleratorResource

    assert AcceleratorResource(device="cuda", precision="bf16").train_overrides()["precision"] == "bf16"
    assert AcceleratorResource(device="cuda", precision="fp32").train_overrides()["precision"] == "fp32"
    assert AcceleratorResource(device="cpu", precision="bf16").train_overrides()["precision"] == "fp32"
    with pytest.raises(ValueError, match="precision"):
        AcceleratorResource(device="cuda", precision="fp16").train_overrides()
