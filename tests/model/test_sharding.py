"""Row-wise sharded embeddings + FSDP2 on 2 gloo ranks (spawned processes) against the single-process
model: each rank holds only its rows, the logits and one training step's update are the same."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from gem_model.config import load_features, load_surfaces
from gem_model.data.loader import Encoder
from gem_model.data.synthetic import synthetic_day
from gem_model.models import GEM, GEMConfig
from gem_model.train.config import load_preset
from gem_model.train.optim import RowWiseAdagrad
from gem_model.train.sharding import (
    RowShardedEmbedding,
    RowShardedLayout,
    embedding_bytes,
    full_state_dict,
    load_full_state_dict,
    shard_model,
)

pytestmark = pytest.mark.timeout(300)
WORLD = 2
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batches(n_per_rank: int):
    """One global batch split in WORLD rank batches (same rows on every process)."""
    features, surfaces = load_features(), load_surfaces()
    mcfg = GEMConfig.from_specs(load_preset("tiny")["model"], features=features, surfaces=surfaces)
    enc = Encoder(features, surfaces, mcfg.seq_len)
    ex, _ = synthetic_day(dt.date(2026, 11, 2), n_per_rank * WORLD, surfaces=surfaces, seed=7)
    chunk = enc.encode(enc.select(ex.lazy()).collect())
    import numpy as np

    return mcfg, [chunk.take(np.arange(r * n_per_rank, (r + 1) * n_per_rank)).to_batch() for r in range(WORLD)]


def _optimizers(model: GEM):
    return (torch.optim.AdamW(model.dense_parameters(), lr=0.005, betas=(0.9, 0.98)),
            RowWiseAdagrad(model.embedding_parameters(), lr=0.05))


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mcfg, batches = _batches(96)
        torch.manual_seed(0)
        reference = GEM(mcfg)  # the single-process model: identical init on every process
        initial = copy.deepcopy(reference.state_dict())
        sharded = shard_model(copy.deepcopy(reference))
        tables = {n: m for n, m in sharded.named_modules() if isinstance(m, RowShardedEmbedding)}
        emb = {id(p) for p in reference.embedding_parameters()}
        ref_tables = {n: m for n, m in reference.named_modules() if isinstance(m, torch.nn.Embedding) and id(m.weight) in emb}
        assert tables.keys() == ref_tables.keys() and tables

        # each rank holds only its rows: ceil(rows / 2), the rows [start, start + local_rows) of the table
        for name, t in tables.items():
            full = ref_tables[name].weight
            assert t.weight.shape == (math.ceil(full.shape[0] / WORLD), full.shape[1])
            assert torch.equal(t.weight[: t.local_rows], full[t.start : t.start + t.local_rows])
            assert torch.count_nonzero(t.weight[t.local_rows :]) == 0  # padding, never looked up
        row_bytes = sum(t.embedding_dim * t.weight.element_size() for t in tables.values())
        replicated = embedding_bytes(reference)

        # optimisers first: between forward and backward FSDP2 exposes the unsharded parameters
        opt_s, opt_se = _optimizers(sharded)
        opt_r, opt_re = _optimizers(reference)

        # logits on this rank's batch == the single-process model's on the same rows
        logits = sharded(batches[rank])
        ref_logits = reference(batches[rank])
        logit_diff = float((logits - ref_logits).detach().abs().max())

        # one step: data-parallel mean of the rank losses == the single-process loss of that mean
        loss = sharded.loss(logits, batches[rank])[0]
        loss.backward()
        layout = RowShardedLayout()
        layout.after_backward(sharded)  # the replicated scalars' gradient mean
        norm = float(layout.clip_grad_norm_(sharded.dense_parameters(), 0.05))  # clips
        opt_s.step()
        opt_se.step()
        ref_loss = sum(reference.loss(reference(b), b)[0] for b in batches) / WORLD
        ref_loss.backward()
        ref_norm = float(torch.nn.utils.clip_grad_norm_(reference.dense_parameters(), 0.05))
        opt_r.step()
        opt_re.step()
        after = full_state_dict(sharded)
        ref_after = {k: v for k, v in reference.state_dict().items()}
        params = {n for n, _ in reference.named_parameters()}
        step_diff = max(float((after[k] - ref_after[k]).abs().max()) for k in params)
        moved = max(float((ref_after[k] - initial[k]).abs().max()) for k in params)
        worst = sorted(((float((after[k] - ref_after[k]).abs().max()), k) for k in params), reverse=True)[:5]
        # the optimiser states gather to the single-process ones (AdamW moments, Adagrad row sums)
        state_diff = 0.0
        for opt, ref_opt in ((opt_s, opt_r), (opt_se, opt_re)):
            got, want = layout.optim_state(opt)["state"], ref_opt.state_dict()["state"]
            assert got.keys() == want.keys()
            for i in want:
                for k in want[i]:
                    assert got[i][k].shape == want[i][k].shape, (i, k)
                    state_diff = max(state_diff, float((got[i][k] - want[i][k]).abs().max()))

        # a full (world-size independent) state dict loads back into a sharded model of any world size
        fresh = shard_model(GEM(mcfg))
        load_full_state_dict(fresh, after)
        reload_diff = float((fresh(batches[rank]) - sharded(batches[rank])).abs().max())
        Path(out, f"rank{rank}.json").write_text(json.dumps({
            "logit_diff": logit_diff, "step_diff": step_diff, "reload_diff": reload_diff, "moved": moved,
            "emb_bytes": embedding_bytes(sharded), "replicated_bytes": replicated, "row_bytes": row_bytes,
            "loss": float(loss), "n_tables": len(tables), "worst": worst,
            "norm": norm, "ref_norm": ref_norm, "state_diff": state_diff,
        }))
    finally:
        torch_dist.destroy_process_group()


def test_row_sharded_model_equals_single_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r in res:
        assert r["logit_diff"] <= TOL, r
        assert r["step_diff"] <= TOL and r["moved"] > 100 * TOL, r  # the step did move the weights
        assert r["reload_diff"] <= TOL and r["state_diff"] <= TOL, r
        assert abs(r["norm"] - r["ref_norm"]) <= TOL * r["ref_norm"] and r["ref_norm"] > 0.05, r  # it clipped
        # per-rank embedding memory: half the replicated layout + at most one padding row per table
        assert r["emb_bytes"] <= r["replicated_bytes"] / WORLD + r["row_bytes"], r
        assert r["emb_bytes"] < 0.6 * r["replicated_bytes"], r
