"""Training: overfitting, learning, checkpoints (weights_only), exact resume, warm start, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gem_model.models import GEM
from gem_model.models.registry import load_model
from gem_model.train.loop import train
from gem_model.train.optim import RowWiseAdagrad
from tests.model.conftest import tiny_config
from tests.model.helpers import make_batch, tiny_model_config

pytestmark = pytest.mark.timeout(300)


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    cfg = tiny_model_config()
    model = GEM(cfg)
    batch = make_batch(cfg, [5, 0, 9, 16, 3, 7, 1, 12] * 4)
    dense = torch.optim.AdamW(model.dense_parameters(), lr=1e-2)
    emb = RowWiseAdagrad(model.embedding_parameters(), lr=0.1)
    first = None
    for _ in range(150):
        loss, _ = model.loss(model(batch), batch)
        first = first if first is not None else float(loss.detach())
        dense.zero_grad()
        emb.zero_grad()
        loss.backward()
        dense.step()
        emb.step()
    assert float(loss.detach()) < 0.05 * first


def test_rowwise_adagrad_touches_only_rows_with_gradient():
    e = torch.nn.Embedding(10, 4)
    before = e.weight.detach().clone()
    opt = RowWiseAdagrad(e.parameters(), lr=0.1)
    e(torch.tensor([2, 5])).sum().backward()
    opt.step()
    changed = (e.weight.detach() != before).any(1)
    assert changed.tolist() == [i in (2, 5) for i in range(10)]
    assert opt.state[e.weight]["sum"].shape == (10,)


def test_train_learns_and_writes_artifacts(lake, tmp_path):
    out = tmp_path / "run"
    cfg = tiny_config(out, epochs=3, lr=0.02, emb_lr=0.1)
    cfg["data"]["train"] = ["2026-11-01", "2026-11-03"]
    summary = train(cfg)
    curve = [loss for _, loss in summary["loss_curve"]]
    assert len(curve) >= 4
    assert sum(curve[-2:]) / 2 < sum(curve[:2]) / 2  # the loss goes down
    click = [r for r in summary["rows"] if r["task"] == "click"]
    assert {r["surface"] for r in click} == {"feed", "reels", "marketplace", "shops"}
    assert sum(r["auc"] for r in click) / len(click) > 0.55  # it learned something that transfers to day E
    for r in summary["rows"]:
        assert r["oracle_ne"] is not None and r["n"] > 0
    assert summary["samples_per_s"] > 0
    for name in ("model.pt", "checkpoint.pt", "best.pt", "metrics.json", "config.json"):
        assert (out / name).exists(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["rows"] and metrics["loss_curve"]
    # every checkpoint loads with weights_only=True
    for name in ("model.pt", "checkpoint.pt", "best.pt"):
        ck = torch.load(out / name, map_location="cpu", weights_only=True)
        assert "model" in ck and "model_config" in ck
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    for key in ("opt_dense", "opt_emb", "step", "epoch", "data_position", "rng", "config"):
        assert key in ck
    model, config = load_model(out)
    assert isinstance(model, GEM) and config["preset"] == "tiny"


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.mark.parametrize("ema_decay", [None, 0.9], ids=["live", "averaged"])
def test_resume_after_failure_matches_uninterrupted_run(lake, tmp_path, ema_decay):
    over = {"epochs": 2, "checkpoint_every": 10, "ema_decay": ema_decay}
    full = train(tiny_config(tmp_path / "full", **over))
    with pytest.raises(RuntimeError, match="simulated failure"):
        train(tiny_config(tmp_path / "crash", **over, fail_at_step=25))
    ck = torch.load(tmp_path / "crash" / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 20  # at most one interval lost
    if ema_decay:  # the checkpoint carries the average beside the live weights
        assert any(not torch.equal(ck["ema"][k], ck["model"][k]) for k in ck["model"])
    resumed = train(tiny_config(tmp_path / "crash", **over), resume=True)
    assert resumed["resumed_from_step"] == 20
    assert resumed["step"] == full["step"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "crash" / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    if ema_decay:  # the average resumed too, and it is what validation kept
        ema_a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["ema"]
        ema_b = torch.load(tmp_path / "crash" / "checkpoint.pt", weights_only=True)["ema"]
        for k in ema_a:
            torch.testing.assert_close(ema_a[k], ema_b[k], rtol=1e-5, atol=1e-6, msg=k)
        best = torch.load(tmp_path / "full" / "best.pt", weights_only=True)["model"]
        assert full["best_step"] == full["step"]  # this run's last validation is its best: best.pt is that average
        assert all(torch.equal(best[k], ema_a[k]) for k in best)
    full_w, crash_w = _weights(tmp_path / "full" / "model.pt"), _weights(tmp_path / "crash" / "model.pt")
    heads = [k for k in full_w if k.startswith("head_b.")]  # one per surface name
    assert len(heads) == 4
    for k in heads:
        torch.testing.assert_close(full_w[k], crash_w[k])


def test_resume_after_kill(lake, tmp_path):
    """A training process killed hard after a checkpoint resumes from it."""
    out = tmp_path / "killed"
    cfg = tiny_config(out, epochs=3, checkpoint_every=5)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "gem_model.train.loop", "--config", str(cfg_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = False
    try:
        for line in proc.stdout:  # wait for progress past the second checkpoint, then SIGKILL
            if "step 10/" in line:
                seen = True
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
    assert seen and proc.returncode == -signal.SIGKILL  # killed midway, not a run that finished on its own
    assert (out / "checkpoint.pt").exists() and not (out / "model.pt").exists()
    step = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    assert step >= 5
    summary = train(cfg, resume=True)
    assert summary["resumed_from_step"] == step and summary["step"] > step
    assert (out / "model.pt").exists()


def test_warm_start(lake, tmp_path):
    first = train(tiny_config(tmp_path / "a", max_steps=5))
    second = train(tiny_config(tmp_path / "b", max_steps=1), init_from=first["checkpoint"])
    assert second["warm_start"]["loaded"] > 0 and second["warm_start"]["skipped"] == 0


def test_torchrun_two_processes_gloo(lake, tmp_path):
    out = tmp_path / "ddp"
    cfg = tiny_config(out, max_steps=6, checkpoint_every=3, dump_rank_weights=True)
    cfg["data"]["valid"] = None
    cfg_path = tmp_path / "cfg.yaml"
    import yaml

    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "gem_model.train.loop", "--config", str(cfg_path)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    w0 = torch.load(out / "rank0.pt", weights_only=True)
    w1 = torch.load(out / "rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys()
    for k in w0:
        torch.testing.assert_close(w0[k], w1[k], msg=k)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["step"] == 6


def test_a_run_resumed_where_it_stopped_early_trains_no_step_more(lake, tmp_path):
    """A checkpoint written at the validation that stopped training (patience spent) resumes to a finished loop."""
    over = {"epochs": 50, "max_steps": None, "eval_every": 5, "checkpoint_every": 5, "patience": 0, "lr": 0.05}
    full = train(tiny_config(tmp_path / "full", **over))
    stopped = full["step"]
    assert stopped % 5 == 0 and full["best_step"] < stopped  # it stopped early, at a validation and a checkpoint
    with pytest.raises(RuntimeError, match="simulated failure"):
        train(tiny_config(tmp_path / "crash", **over, fail_at_step=stopped))
    resumed = train(tiny_config(tmp_path / "crash", **over), resume=True)
    assert resumed["resumed_from_step"] == stopped
    assert resumed["step"] == stopped and resumed["best_step"] == full["best_step"]
    assert resumed["loss_curve"] == full["loss_curve"] and resumed["valid_history"] == full["valid_history"]
