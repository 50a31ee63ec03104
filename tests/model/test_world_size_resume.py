"""A checkpoint is world-size independent: the data position is global, so a run saved by 2 ranks
resumes on 1 and vice versa, and every global batch of the epoch is seen exactly once."""

from __future__ import annotations

import itertools
import json
import os
import subprocess

import pytest
import torch
import yaml

from gem_model.data.loader import ExampleStream
from gem_model.train.distributed import resume_step, torchrun_command
from gem_model.train.loop import CHECKPOINT, train
from tests.model.conftest import tiny_config

pytestmark = pytest.mark.timeout(300)
DAY = "2026-11-02"
BATCH = 128


def _stream(lake, world: int = 1, rank: int = 0) -> ExampleStream:
    s = ExampleStream(DAY, DAY, batch_size=BATCH, shuffle=True, shuffle_buffer=1024, chunk_rows=512, seed=5,
                      uri=str(lake / "training_examples"), rank=rank, world_size=world)
    s.set_epoch(0)
    return s


def _ids(batches) -> list[tuple[str, ...]]:
    return [tuple(b.request_ids) for b in batches]


def test_stream_position_is_global_across_world_sizes(lake):
    reference = _ids(_stream(lake))  # every global batch of the epoch, in order (world size 1)
    assert len(reference) > 12

    # 2 ranks take 3 rounds (global batches 0..5), then 1 rank resumes at global batch 6
    ranks = [_stream(lake, 2, r) for r in (0, 1)]
    taken = [_ids(itertools.islice(iter(s), 3)) for s in ranks]
    assert taken[0] == reference[0:6:2] and taken[1] == reference[1:6:2]
    assert {s.global_position for s in ranks} == {6}
    single = _stream(lake)
    single.load_state_dict(ranks[0].state_dict())
    assert _ids(single) == reference[6:]

    # 1 rank takes 5 batches (an odd number), then 2 ranks resume at global batch 5
    single = _stream(lake)
    assert _ids(itertools.islice(iter(single), 5)) == reference[:5]
    state = single.state_dict()
    assert state["global_position"] == 5
    resumed = [_stream(lake, 2, r) for r in (0, 1)]
    for s in resumed:
        s.load_state_dict(state)
    got = [_ids(s) for s in resumed]
    rounds = (len(reference) - 5) // 2  # a last incomplete round is dropped (equal steps on every rank)
    assert got[0] == [reference[5 + 2 * i] for i in range(rounds)]
    assert got[1] == [reference[6 + 2 * i] for i in range(rounds)]


def test_resume_step_keeps_global_progress():
    assert resume_step(6, 2, 1) == 12 and resume_step(6, 1, 2) == 3 and resume_step(4, 2, 2) == 4


def test_checkpoint_resumes_under_either_world_size(lake, tmp_path):
    """world 1 (crash at step 6) -> world 2 under torchrun (resume, crash at step 6) -> world 1 finishes."""
    out = tmp_path / "run"
    base = tiny_config(out, checkpoint_every=3, fail_at_step=6)
    base["data"].update(train=[DAY, DAY], valid=None, eval=None)
    per_epoch = ExampleStream(DAY, DAY, uri=str(lake / "training_examples")).count_rows() // BATCH

    with pytest.raises(RuntimeError, match="simulated failure"):
        train(base)
    ck1 = torch.load(out / CHECKPOINT, weights_only=True)
    assert (ck1["world_size"], ck1["step"], ck1["global_position"]) == (1, 6, 6)

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(base))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(torchrun_command("gem_model.train.loop", 2, ["--config", str(cfg_path), "--resume"]),
                         env=env, capture_output=True, text=True, timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode != 0 and "simulated failure at step 6" in log, log[-3000:]
    assert "at step 3 (epoch 0, global batch 6, saved by world size 1)" in log, log[-3000:]
    ck2 = torch.load(out / CHECKPOINT, weights_only=True)
    # rank 0 saved the whole model (DDP keeps it replicated) and the global position: 6 + 3 rounds of 2
    assert (ck2["world_size"], ck2["step"], ck2["global_position"]) == (2, 6, 12)
    assert ck2["model"].keys() == ck1["model"].keys()
    assert any(not torch.equal(ck1["model"][k], ck2["model"][k]) for k in ck1["model"])  # it trained

    done = train({**base, "train": {**base["train"], "fail_at_step": None}}, resume=True)
    assert done["resumed_from_step"] == 12 and done["world_size"] == 1
    assert done["step"] == per_epoch  # the remaining global batches 12.. were each taken once
    final = json.loads((out / "metrics.json").read_text())
    assert final["step"] == per_epoch


def test_row_sharded_training_writes_an_unsharded_checkpoint(lake, tmp_path):
    """2 ranks with row-sharded tables + FSDP2 train (with the weights' average), validate, evaluate and save
    through rank 0 a consolidated checkpoint; one process without sharding resumes it."""
    out = tmp_path / "sharded"
    cfg = tiny_config(out, max_steps=4, checkpoint_every=2, embedding_sharding="row", ema_decay=0.9,
                      dump_rank_weights=True)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(torchrun_command("gem_model.train.loop", 2, ["--config", str(cfg_path)]),
                         env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["step"] == 4 and metrics["rows"]  # evaluated on day E

    from gem_model.models import GEM, GEMConfig

    ck = torch.load(out / CHECKPOINT, weights_only=True)
    full = GEM(GEMConfig.from_dict(ck["model_config"])).state_dict()
    assert {k: tuple(v.shape) for k, v in ck["model"].items()} == {k: tuple(v.shape) for k, v in full.items()}
    # the weights' average is gathered from the shards as the weights are
    assert {k: tuple(v.shape) for k, v in ck["ema"].items()} == {k: tuple(v.shape) for k, v in full.items()}
    assert ck["ema_updates"] == 4 and all(torch.isfinite(v).all() for v in ck["ema"].values())
    served = torch.load(out / "model.pt", weights_only=True)["model"]  # the last validation's average, selected
    assert metrics["best_step"] == 4 and all(torch.equal(served[k], ck["ema"][k]) for k in served)
    live = torch.load(out / "rank0.pt", weights_only=True)  # the live weights at the end, before selection
    assert any(not torch.equal(served[k], live[k]) for k in served)  # the shards' average, not the live weights
    rows = [p.shape[0] for p in GEM(GEMConfig.from_dict(ck["model_config"])).embedding_parameters()]
    assert [s["sum"].shape[0] for s in ck["opt_emb"]["state"].values()] == rows  # Adagrad state of every row

    resumed = train({**cfg, "train": {**cfg["train"], "max_steps": 10, "embedding_sharding": "replicated"}},
                    resume=True)
    assert resumed["resumed_from_step"] == 8 and resumed["step"] == 10 and resumed["world_size"] == 1
