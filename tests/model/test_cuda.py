"""The model on CUDA (run by bench/gpu_check.sh; skipped without a GPU): the bf16 autocast step
that crashed (CUDA autocast runs `exp` in fp32, which CPU autocast does not reproduce) matches fp32
(tests/model/test_bf16.py checks the same on CPU), and a training step performs no host
synchronisation."""

from __future__ import annotations

import pytest
import torch

from gem_model.models import GEM
from gem_model.train.optim import RowWiseAdagrad
from tests.model.helpers import BF16_LENGTHS, assert_bf16_gradients_match, make_batch, tiny_model_config

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bench/gpu_check.sh runs it)"),
    pytest.mark.timeout(300),
]


def _model_and_batch():
    torch.manual_seed(0)
    cfg = tiny_model_config(n_heads=1, d_model=32)
    return GEM(cfg).cuda(), make_batch(cfg, BF16_LENGTHS).pin_memory().to("cuda", non_blocking=True)


def test_bf16_autocast_gradients_match_fp32():
    assert_bf16_gradients_match("cuda")


def test_training_step_has_no_host_sync():
    model, batch = _model_and_batch()
    dense = torch.optim.AdamW(model.dense_parameters(), lr=1e-3, fused=True)
    emb = RowWiseAdagrad(model.embedding_parameters(), lr=0.05)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch)
        loss, _ = model.loss(logits, batch)
        dense.zero_grad(set_to_none=True)
        emb.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.dense_parameters(), 1.0)
        dense.step()
        emb.step()
        return loss.detach()

    step()  # lazy initialisation (optimizer state, Triton compilation) may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [step() for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool(torch.isfinite(torch.stack(losses)).all())
