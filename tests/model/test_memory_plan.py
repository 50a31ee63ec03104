"""The memory plan: per-rank bytes of the sharded layout against the replicated one, and the CLI."""

from __future__ import annotations

import math

import pytest
import torch

from gem_model.models import GEM, GEMConfig
from gem_model.train.config import load_preset
from gem_model.train.memory_plan import FP32, main, measured_activation_bytes, plan


def test_sharded_embeddings_are_a_world_size_fraction_plus_padding():
    cfg = GEMConfig.from_specs(load_preset("large")["model"])
    with torch.device("meta"):
        model = GEM(cfg)
    emb = sum(p.numel() for p in model.embedding_parameters())  # what gem_model.train.sharding shards
    one = plan("large", 1, 80)
    assert one.sparse_params == emb and one.dense_params == sum(p.numel() for p in model.parameters()) - emb
    assert one.embedding_sharded == one.embedding_replicated == emb * FP32  # one GPU holds every row
    for gpus in (1, 8, 64):
        p = plan("large", gpus, 80)
        # every table: ceil(rows / N) rows of d_model (the wide tables: one column per task)
        padding = sum(FP32 * cfg.d_model + FP32 * 2 for _ in cfg.tables)
        assert p.embedding_replicated / gpus <= p.embedding_sharded <= p.embedding_replicated / gpus + padding
        assert p.dense_weights == math.ceil(p.dense_params / gpus) * FP32
        assert p.optimizer == 2 * p.dense_weights
    assert plan("large", 8, 80).total < plan("large", 8, 80).total_replicated


def test_bigger_vocabulary_and_fit_verdict():
    small = plan("large", 8, 80, batch_per_rank=1024)
    big = plan("large", 8, 80, batch_per_rank=1024, rows={"user": 10**9})
    assert big.sparse_params > small.sparse_params + 10**9 * 512
    assert small.fits and not big.fits  # 1e9 user rows of 512 fp32 do not fit 8 x 80 GB
    most = small.max_batch_per_rank
    assert plan("large", 8, 80, batch_per_rank=most).fits and not plan("large", 8, 80, batch_per_rank=most + 1).fits
    with pytest.raises(ValueError, match="unknown tables"):
        plan("large", 8, 80, rows={"nope": 3})


def test_cli_prints_the_table(capsys):
    assert main(["--preset", "large", "--gpus", "8", "64", "--gpu-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "emb GB/rank sharded" in out and "fits" in out and out.count("large") == 2


def test_measured_activations_feed_the_plan():
    per_sample = measured_activation_bytes("tiny", batch=2)
    # at least the tokens every block keeps: each history entry of d_model floats, for each block
    cfg = GEMConfig.from_specs(load_preset("tiny")["model"])
    assert per_sample > cfg.seq_len * cfg.d_model * FP32 * cfg.n_blocks
    p = plan("tiny", 2, 80, batch_per_rank=100, activations_per_sample=per_sample)
    assert p.activations == per_sample * 100
