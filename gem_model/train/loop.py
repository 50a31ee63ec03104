"""Train GEM: a library function, a CLI, and a torchrun entry point.

    python -m gem_model.train.loop --config run.yaml [--resume]
    torchrun --nproc_per_node 2 -m gem_model.train.loop --config run.yaml

The config is a plain dict (JSON or YAML file):

    preset: small                 # assets/models/<preset>.yaml, or a path to such a file
    model: {d_model: 64}          # overrides of the preset's model dims
    train: {epochs: 2}            # overrides of the preset's training hyperparameters
    data:
      train: [2026-11-02, 2026-11-04]   # inclusive date range
      valid: 2026-11-06           # model selection / early stopping (optional)
      eval: 2026-11-07            # final metrics, with the oracle when present (optional)
      surfaces: null              # null = every surface of surfaces.yaml
      own_surface: false          # one surface read as a model of it alone sees it (gem_model.data.own_surface)
      lake: null                  # lake root (default GEM_LAKE_URI or $GEM_HOME/lake)
    seed: 0
    device: auto                  # auto | cpu | cuda
    out_dir: /path/to/run         # checkpoint.pt, best.pt, model.pt, metrics.json, config.json
    tracking: {project: gem, group: null, name: null, job_type: train}

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DDP (gloo on CPU, NCCL on GPU), or with
`train.embedding_sharding: row` its tables are sharded row-wise and the rest goes under FSDP2
(gem_model.train.sharding); every rank reads its shard of the stream; rank 0 alone logs, checkpoints and
writes files. Checkpoints hold the unsharded state and a global data position: any world size resumes them.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.distributed as torch_dist
import yaml

from gem_model.config import (
    ASSETS_DIR,
    SOURCES_DIR,
    TASKS,
    FeaturesConfig,
    SurfacesConfig,
    dataset_name,
    load_features,
    load_surfaces,
)
from gem_model.data.loader import ExampleStream
from gem_model.data.normalization import base_rates, dense_stats
from gem_model.data.vocab import collision_rates
from gem_model.eval.metrics import metric_rows, predict, read_oracle
from gem_model.models import GEM, GEMConfig
from gem_model.models.calibration import DEFAULT_CALIBRATION, Calibrator, calibration_days, fit_model_calibrator
from gem_model.store import atomic
from gem_model.store.paths import gem_home, storage_options, table_uri
from gem_model.train.distributed import resume_step
from gem_model.train.optim import RowWiseAdagrad
from gem_model.train.precision import autocast_dtype
from gem_model.train.sharding import ReplicatedLayout, RowShardedLayout, shard_model
from gem_model.train.tracking import Tracker

CHECKPOINT = "checkpoint.pt"  # full resumable state, rewritten every `checkpoint_every` steps
BEST = "best.pt"  # weights of the best validation score so far
MODEL = "model.pt"  # the selected model: what downstream assets load
EVAL_PREDICTIONS = "eval_predictions.parquet"  # p_click of every clickable row of E
DEFAULT_TRAIN: dict[str, Any] = {
    "batch_size": 1024,
    "eval_batch_size": 4096,
    "lr": 0.004,
    "emb_lr": 0.05,
    "emb_weight_decay": 0.0,  # row-wise Adagrad: L2 on the rows a batch touches
    "wide_weight_decay": None,  # L2 on the per-id wide offsets (None: emb_weight_decay)
    "wide_lr": None,  # row-wise Adagrad rate of the per-id wide offsets (None: emb_lr)
    "weight_decay": 0.0,
    "epochs": 1,
    "max_steps": None,
    "warmup_steps": 20,
    "min_lr_frac": 0.1,
    "grad_clip": 1.0,
    "checkpoint_every": 100,
    "log_every": 20,
    "eval_every": None,
    "patience": 1,
    "shuffle_buffer": 65536,
    "chunk_rows": 16384,
    "compile": False,
    "embedding_sharding": "replicated",  # or "row": tables row-wise across ranks, dense params FSDP2 (gem_model.train.sharding)
    "precision": "auto",  # auto (bf16 autocast on CUDA, fp32 elsewhere) | bf16 (autocast on any device) | fp32
    "torch_threads": None,
    # {features: [sparse feature names], l2: float, passes: int = 1}: their wide offsets start at an L2
    # logistic regression on the training window's labels, `passes` backfitting sweeps
    # (gem_model.train.wide_prior); None: zeros
    "wide_prior": None,
    # {dim: int, max_rows: int = 8192}: the shared item table starts from the PPMI-SVD directions of the training window's
    # history-item / candidate co-occurrence (gem_model.train.item_svd); None: random
    "item_svd": None,
    "head_bias": "fixed",  # fixed (the model's init) | base_rate (logit of each head's training-window rate)
    # {features: [dense feature names], l2: float}: each head's bias and wide weights of these features
    # start at an L2 logistic regression on the training window (gem_model.train.wide_prior.set_dense_prior;
    # meant for counters, which come from earlier days); None: zero weights
    "dense_prior": None,
    "fail_at_step": None,  # tests: raise after this step (after its checkpoint, if any)
    "dump_rank_weights": False,  # tests: write rank<r>.pt with each rank's final weights
    "calibrate": DEFAULT_CALIBRATION["enabled"],  # Platt map per (surface, task) fitted on E-1 after selection
    "calibration_min_positives": DEFAULT_CALIBRATION["min_positives"],  # fewer on E-1: identity for that head
}


# ------------------------------------------------------------------------------------------------
# Config


def load_preset(preset: str | Path) -> dict[str, Any]:
    """assets/models/<name>.yaml (or a path) -> {"model": {...}, "train": {...}}. A named preset
    also takes the GEM_DATA dataset's adjustments, assets/sources/<dataset>/models/<name>.yaml, on
    top (a real dataset's click rate and size are not the simulator's)."""
    path = Path(preset)
    layers = [path]
    if not path.suffix:
        path = ASSETS_DIR / "models" / f"{preset}.yaml"
        layers = [path, SOURCES_DIR / dataset_name() / "models" / f"{preset}.yaml"]
    out: dict[str, Any] = {"model": {}, "train": {}}
    for p in layers:
        raw = (yaml.safe_load(p.read_text()) or {}) if p == path or p.is_file() else {}
        for k in out:
            out[k].update(raw.get(k) or {})
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text()
    return json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)


def _iso(d: Any) -> str | None:
    return None if d is None else (d.isoformat() if isinstance(d, dt.date) else str(d))


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Preset + overrides -> a complete plain dict (what config.json and checkpoints carry)."""
    config = copy.deepcopy(config)
    preset = load_preset(config.get("preset", "tiny")) if config.get("preset", "tiny") else {}
    data = dict(config.get("data") or {})
    if "train" not in data:
        raise ValueError("config.data.train = [first_date, last_date] is required")
    train_range = data["train"]
    if isinstance(train_range, str | dt.date):
        train_range = [train_range, train_range]
    out = {
        "preset": str(config.get("preset", "tiny")),
        "model": {**preset.get("model", {}), **(config.get("model") or {})},
        "train": {**DEFAULT_TRAIN, **preset.get("train", {}), **(config.get("train") or {})},
        "data": {
            "train": [_iso(train_range[0]), _iso(train_range[1])],
            "valid": _iso(data.get("valid")),
            "eval": _iso(data.get("eval")),
            "surfaces": list(data["surfaces"]) if data.get("surfaces") else None,
            "own_surface": bool(data.get("own_surface", False)),
            "lake": data.get("lake"),
            "oracle": bool(data.get("oracle", True)),
        },
        "seed": int(config.get("seed", 0)),
        "device": str(config.get("device", "auto")),
        "out_dir": str(config["out_dir"]) if config.get("out_dir") else None,
        "tracking": {"project": "gem", "group": None, "name": None, "job_type": "train", **(config.get("tracking") or {})},
    }
    return out


# ------------------------------------------------------------------------------------------------
# Distributed / device helpers


def dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        return torch.device("cuda", local_rank)
    return torch.device(name)


def _rng_state() -> dict[str, torch.Tensor]:
    """RNG states as tensors only (so checkpoints load with weights_only=True)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_meta": torch.tensor([np_state[2], np_state[3]], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_state[4]], dtype=torch.float64),
        "python": torch.tensor(list(py_state[1]), dtype=torch.int64),
        "python_version": torch.tensor([py_state[0]], dtype=torch.int64),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(s: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(s["torch"])
    meta = s["numpy_meta"].tolist()
    np.random.set_state(("MT19937", s["numpy_keys"].numpy().astype(np.uint32), meta[0], meta[1], float(s["numpy_gauss"][0])))
    random.setstate((int(s["python_version"][0]), tuple(int(x) for x in s["python"].tolist()), None))
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])


atomic_save = atomic.torch_save  # (obj, path): gem_model.store.atomic is the one atomic-write helper


def atomic_write_json(obj: Any, path: Path) -> None:
    atomic.write_json(path, obj, allow_nan=True)


def warm_start(model: torch.nn.Module, source: str | Path) -> dict[str, int]:
    """Copy every tensor of a checkpoint whose name and shape match; returns counts."""
    path = Path(source)
    if path.is_dir():
        path = path / MODEL if (path / MODEL).exists() else path / CHECKPOINT
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    own = model.state_dict()
    loaded = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(loaded, strict=False)
    return {"loaded": len(loaded), "skipped": len(own) - len(loaded)}


@torch.no_grad()
def set_head_bias(model: GEM, rates: dict[str, dict[str, float]]) -> None:
    """Each (surface, task) head's bias := logit of its rate (clamped away from 0 and 1)."""
    for s, per_task in rates.items():
        if s in model.head_b:
            for t, rate in per_task.items():
                p = min(max(rate, 1e-4), 1 - 1e-4)
                model.head_b[s][TASKS.index(t)] = math.log(p / (1 - p))


def lr_factor(step: int, warmup: int, total: int, min_frac: float) -> float:
    """Linear warmup, then cosine decay to min_frac at `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * t))


def _score(rows: list[dict[str, Any]]) -> float:
    """Model-selection score: NE over the (surface, task) pairs with positives, weighted by positives
    (lower is better), so a pair with a handful of positives cannot swing early stopping."""
    kept = [r for r in rows if r["positives"] > 0 and math.isfinite(r["ne"])]
    if not kept:
        return float("inf")
    return float(np.average([r["ne"] for r in kept], weights=[r["positives"] for r in kept]))


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[gem_model.train.loop] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# The training loop


def train(
    config: dict[str, Any],
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    init_from: str | Path | None = None,
    tracker: Tracker | None = None,
    features: FeaturesConfig | None = None,
    surfaces: SurfacesConfig | None = None,
) -> dict[str, Any]:
    """Train (or resume) one GEM model; returns the summary that is also written to metrics.json."""
    cfg = resolve_config({**config, **({"out_dir": str(out_dir)} if out_dir is not None else {})})
    if not cfg["out_dir"]:
        raise ValueError("out_dir is required (argument or config.out_dir)")
    out = Path(cfg["out_dir"])
    tcfg, dcfg = cfg["train"], cfg["data"]
    features = features or load_features()
    surfaces = surfaces or load_surfaces()

    rank, world, local_rank = dist_env()
    device = pick_device(cfg["device"], local_rank)
    if device.type == "cuda":  # TF32 for fp32 matmuls (cuBLAS and the Triton kernels' dots)
        torch.set_float32_matmul_precision("high")
    own_pg = False
    if world > 1 and not torch_dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        own_pg = True
    if tcfg["torch_threads"]:
        torch.set_num_threads(int(tcfg["torch_threads"]))
    elif world > 1 and device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))

    seed = cfg["seed"]
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)

    # -- model ------------------------------------------------------------------------------------
    mcfg = GEMConfig.from_specs(cfg["model"], features=features, surfaces=surfaces, surface_names=dcfg["surfaces"])
    if tcfg["embedding_sharding"] not in ("replicated", "row"):
        raise ValueError(f"train.embedding_sharding must be 'replicated' or 'row', not {tcfg['embedding_sharding']!r}")
    sharded = world > 1 and tcfg["embedding_sharding"] == "row"
    layout = RowShardedLayout() if sharded else ReplicatedLayout()  # state calls: full (unsharded) layout
    model = GEM(mcfg) if sharded else GEM(mcfg).to(device)  # sharded: only this rank's part reaches the device
    warm = warm_start(model, init_from) if init_from else None
    core = model
    if tcfg["compile"]:  # the inductor cache lives under GEM_HOME: warm starts compile in seconds
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(gem_home() / "torch_compile_cache"))
        core.compile_dense()
    if sharded:
        shard_model(model, device=device)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    fwd = model

    opt_dense = torch.optim.AdamW(core.dense_parameters(), lr=tcfg["lr"], weight_decay=tcfg["weight_decay"], betas=(0.9, 0.98),
                                  fused=device.type == "cuda" or None)  # one kernel for every parameter on CUDA
    wide_ids = {id(p) for p in core.wide_tables.parameters()}
    wide_wd = tcfg["emb_weight_decay"] if tcfg.get("wide_weight_decay") is None else tcfg["wide_weight_decay"]
    opt_emb = RowWiseAdagrad(
        [{"params": [p for p in core.embedding_parameters() if id(p) not in wide_ids]},
         {"params": list(core.wide_tables.parameters()), "weight_decay": float(wide_wd)}],
        lr=tcfg["emb_lr"], weight_decay=tcfg["emb_weight_decay"],
    )
    # a logistic regression's rate for the wide offsets (a linear model on ids), the tables' own for the rest
    emb_lrs = [float(tcfg["emb_lr"]), float(tcfg["emb_lr"] if tcfg.get("wide_lr") is None else tcfg["wide_lr"])]
    amp_dtype = autocast_dtype(str(tcfg["precision"]), device)
    amp = amp_dtype is not None

    # -- data ---------------------------------------------------------------------------------------
    lake = dcfg["lake"]
    uri = table_uri("training_examples", lake) if lake else table_uri("training_examples")
    so = storage_options()
    common = {"features": features, "surfaces_config": surfaces, "uri": uri, "storage_options": so,
              "max_len": mcfg.seq_len, "chunk_rows": tcfg["chunk_rows"], "pin_memory": device.type == "cuda",
              "own_surface": dcfg["own_surface"]}
    stream = ExampleStream(dcfg["train"][0], dcfg["train"][1], dcfg["surfaces"], batch_size=tcfg["batch_size"],
                           shuffle=True, shuffle_buffer=tcfg["shuffle_buffer"], seed=seed, rank=rank,
                           world_size=world, **common)

    def eval_stream(day: str) -> ExampleStream:
        return ExampleStream(day, day, dcfg["surfaces"], batch_size=tcfg["eval_batch_size"], shuffle=False, **common)

    def window_pass() -> ExampleStream:  # the training window read once, in order (the start-up fits)
        return ExampleStream(dcfg["train"][0], dcfg["train"][1], dcfg["surfaces"], batch_size=tcfg["eval_batch_size"],
                             shuffle=False, **common)

    # dense inputs standardised with the training window's statistics (saved in the state dict;
    # a resumed run reloads them with the weights)
    train_days = [d.isoformat() for d in stream.dates]
    core.set_dense_stats(*dense_stats(uri, [dt.date.fromisoformat(d) for d in train_days], dcfg["surfaces"],
                                      features, so, stream.own_surface))
    if tcfg["head_bias"] == "base_rate" and not init_from:  # a fresh head starts at the base rate, not at
        # the model's fixed init (a CTR-2% prior: -3 logits is 400 steps away from a 70% rating-click world)
        set_head_bias(core, base_rates(uri, [dt.date.fromisoformat(d) for d in train_days], dcfg["surfaces"], so))
    if tcfg.get("dense_prior") and not init_from:
        from gem_model.train.wide_prior import set_dense_prior

        dp = tcfg["dense_prior"]
        rows = set_dense_prior(core, window_pass(), list(dp["features"]), float(dp.get("l2", 1.0)))
        _say(rank, f"dense prior on {list(dp['features'])}: labelled click rows {rows}")
    if tcfg.get("wide_prior") and not init_from:
        if sharded:
            raise ValueError("train.wide_prior needs replicated embedding tables")
        from gem_model.train.wide_prior import set_wide_prior

        wp = tcfg["wide_prior"]
        seen = set_wide_prior(core, window_pass(), list(wp["features"]), float(wp["l2"]), passes=int(wp.get("passes", 1)))
        _say(rank, f"wide prior (l2 {wp['l2']}, {int(wp.get('passes', 1))} pass(es)): ids with labels {seen}")
    if tcfg.get("item_svd") and not (resume and (out / CHECKPOINT).exists()):
        if sharded:
            raise ValueError("train.item_svd needs replicated embedding tables")
        from gem_model.train.item_svd import MAX_ROWS, start_item_table

        # warm: the window's new ids are folded into the old basis (and the frozen topic buffer)
        info = start_item_table(core, window_pass(), int(tcfg["item_svd"]["dim"]),
                                int(tcfg["item_svd"].get("max_rows", MAX_ROWS)), warm=bool(init_from))
        _say(rank, f"item table from PPMI-SVD: {info}")
    collisions = collision_rates(uri, [dt.date.fromisoformat(d) for d in train_days], dcfg["surfaces"], features, so) \
        if rank == 0 else {}

    if tcfg["max_steps"]:
        total_steps = int(tcfg["max_steps"])
    else:
        per_epoch = stream.count_rows() // (tcfg["batch_size"] * world)
        total_steps = max(1, per_epoch * int(tcfg["epochs"]))

    # -- state (fresh or resumed) -------------------------------------------------------------------
    step, epoch = 0, 0
    best: dict[str, Any] = {"score": float("inf"), "step": -1, "evals_since": 0, "rows": []}
    loss_curve: list[list[float]] = []
    valid_history: list[list[float]] = []
    resumed_from = None
    ckpt_path = out / CHECKPOINT
    if resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        layout.load_model_state(core, ck["model"])
        layout.load_optim_state(opt_dense, ck["opt_dense"])
        layout.load_optim_state(opt_emb, ck["opt_emb"])
        # world-size independent: the data position is global, a step is one batch per rank
        saved_world = int(ck.get("world_size", world))
        step, epoch = resume_step(int(ck["step"]), saved_world, world), int(ck["epoch"])
        stream.load_state_dict({"epoch": epoch, "global_position": int(ck.get("global_position", int(ck["data_position"]) * saved_world))})
        _set_rng_state(ck["rng"])
        best = json.loads(ck["best"])
        loss_curve = ck["loss_curve"].tolist()
        valid_history = ck["valid_history"].tolist()
        resumed_from = step
        _say(rank, f"resumed from {ckpt_path} at step {step} (epoch {epoch}, global batch {stream.global_position}, "
                   f"saved by world size {saved_world})")
    else:
        stream.set_epoch(0)

    if tracker is None and rank == 0:
        tr = cfg["tracking"]
        tracker = Tracker(project=tr["project"], name=tr["name"], group=tr["group"], job_type=tr["job_type"], config=cfg)
        own_tracker = True
    else:
        own_tracker = False

    def state_dict_ckpt() -> dict[str, Any]:
        return {
            "model": layout.model_state(core),
            "opt_dense": layout.optim_state(opt_dense),
            "opt_emb": layout.optim_state(opt_emb),
            "step": step,
            "epoch": stream.epoch,
            "data_position": stream.position,
            "global_position": stream.global_position,
            "world_size": world,
            "rng": _rng_state(),
            "best": json.dumps(best),
            "loss_curve": torch.tensor(loss_curve, dtype=torch.float64).reshape(-1, 2),
            "valid_history": torch.tensor(valid_history, dtype=torch.float64).reshape(-1, 2),
            "config": cfg,
            "model_config": mcfg.to_dict(),
        }

    def save_checkpoint() -> None:
        """Rank 0 writes; under a sharded layout every rank takes part in gathering the state."""
        if rank == 0 or layout.collective:
            ck = state_dict_ckpt()
            if rank == 0:
                atomic_save(ck, ckpt_path)

    def validate() -> None:
        if not dcfg["valid"]:
            return
        rows = metric_rows(predict(core, eval_stream(dcfg["valid"]), device=device,
                                   amp_dtype=amp_dtype))
        score = _score(rows)
        valid_history.append([float(step), score])
        if tracker is not None:
            tracker.log({"valid/mean_ne": score}, step=step)
            tracker.log_metric_rows(rows, "valid", step=step)
        if score < best["score"]:
            best.update(score=score, step=step, evals_since=0, rows=rows)
            state = layout.model_state(core) if rank == 0 or layout.collective else None
            if rank == 0:
                atomic_save({"model": state, "model_config": mcfg.to_dict(), "config": cfg, "step": step}, out / BEST)
        else:
            best["evals_since"] += 1
        _say(rank, f"valid step {step}: mean NE {score:.4f} (best {best['score']:.4f} at step {best['step']})")

    # -- loop -----------------------------------------------------------------------------------------
    model.train()
    t_train, n_samples, stop = 0.0, 0, False
    log_loss_sum: torch.Tensor | float = 0.0  # summed on the device, read back every log_every steps
    log_n = 0
    epochs = int(tcfg["epochs"]) if not tcfg["max_steps"] else 10**9
    t0 = time.perf_counter()
    _say(rank, f"{core.param_counts()} params; {total_steps} steps; device {device}; world {world}")
    while epoch < epochs and not stop and step < total_steps:
        tick = time.perf_counter()
        for batch in stream:
            batch = batch.to(device, non_blocking=True)
            f = lr_factor(step, int(tcfg["warmup_steps"]), total_steps, float(tcfg["min_lr_frac"]))
            for g in opt_dense.param_groups:
                g["lr"] = tcfg["lr"] * f
            for g, base_lr in zip(opt_emb.param_groups, emb_lrs, strict=True):
                g["lr"] = base_lr * f
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp):
                logits = fwd(batch)
            loss, parts = core.loss(logits, batch)
            opt_dense.zero_grad(set_to_none=True)
            opt_emb.zero_grad(set_to_none=True)
            loss.backward()
            layout.after_backward(core)
            if tcfg["grad_clip"]:
                layout.clip_grad_norm_(core.dense_parameters(), float(tcfg["grad_clip"]))
            opt_dense.step()
            opt_emb.step()
            step += 1
            n_samples += len(batch) * world
            log_loss_sum = log_loss_sum + loss.detach()
            log_n += 1
            if step % int(tcfg["log_every"]) == 0 or step == total_steps:
                t_train += time.perf_counter() - tick
                tick = time.perf_counter()
                avg = float(log_loss_sum) / max(1, log_n)
                loss_curve.append([float(step), avg])
                sps = n_samples / max(t_train, 1e-9)
                _say(rank, f"step {step}/{total_steps} epoch {stream.epoch} loss {avg:.4f} lr {tcfg['lr'] * f:.2e} {sps:,.0f} samples/s")
                if tracker is not None:
                    tracker.log({"train/loss": avg, "train/lr": tcfg["lr"] * f, "train/samples_per_s": sps,
                                 **{f"train/loss_{k}": float(v) for k, v in parts.items()}}, step=step)
                log_loss_sum, log_n = 0.0, 0
            if tcfg["eval_every"] and step % int(tcfg["eval_every"]) == 0:
                t_train += time.perf_counter() - tick
                validate()
                tick = time.perf_counter()
            if step % int(tcfg["checkpoint_every"]) == 0:
                save_checkpoint()
            if tcfg["fail_at_step"] and step == int(tcfg["fail_at_step"]):
                raise RuntimeError(f"simulated failure at step {step} (train.fail_at_step)")
            if step >= total_steps or (best["evals_since"] > int(tcfg["patience"])):
                stop = True
                break
        t_train += time.perf_counter() - tick
        if stop:
            break
        epoch += 1
        if not tcfg["eval_every"]:
            validate()
            if best["evals_since"] > int(tcfg["patience"]):
                _say(rank, f"early stopping after epoch {epoch}")
                stop = True
        stream.set_epoch(epoch)
        save_checkpoint()
    if dcfg["valid"] and (not valid_history or valid_history[-1][0] != step):
        validate()
    wall = time.perf_counter() - t0
    if world > 1:  # DDP syncs buffers (BatchNorm statistics) from rank 0 before each forward: finish that
        for buf in core.buffers():
            torch_dist.broadcast(buf, 0)
    if tcfg.get("dump_rank_weights"):  # tests: every rank's final weights, before selection
        atomic_save(layout.model_state(core), out / f"rank{rank}.pt")

    # -- select, evaluate, write -----------------------------------------------------------------------
    if (rank == 0 or layout.collective) and dcfg["valid"] and (out / BEST).exists():
        layout.load_model_state(core, torch.load(out / BEST, map_location="cpu", weights_only=True)["model"])
    calibrator: Calibrator | None = None
    if (rank == 0 or layout.collective) and dcfg["valid"] and tcfg["calibrate"]:
        # post-hoc Platt map per (surface, task) on the selected model's predictions of every day after its
        # window up to E-1, each surface's map shrunk toward the pooled one (gem_model.models.calibration)
        calibrator = fit_model_calibrator(
            lambda day: predict(core, eval_stream(day), device=device, amp_dtype=amp_dtype),
            calibration_days(dcfg["train"][1], dcfg["valid"]), list(core.cfg.surfaces),
            min_positives=int(tcfg["calibration_min_positives"]),
            shrink_positives=float(tcfg.get("calibration_shrink_positives", DEFAULT_CALIBRATION["shrink_positives"])))
        core.calibrator = calibrator  # metrics.predict applies it from here on
        _say(rank, f"calibrator fitted on {calibrator.fit_day}: {int(calibrator.fitted.sum())} of "
                   f"{calibrator.fitted.numel()} heads (others: identity, < {tcfg['calibration_min_positives']} positives)")
    rows: list[dict[str, Any]] = []
    if (rank == 0 or layout.collective) and dcfg["eval"]:  # sharded: every rank takes part in the forward
        oracle_df = None
        if dcfg["oracle"]:
            oracle_df = read_oracle([dcfg["eval"]], dcfg["surfaces"], uri=table_uri("oracle", lake), storage_options=so,
                                    missing_ok=True)
            if oracle_df is None:  # real logs
                _say(rank, f"no oracle table in this lake: metrics on {dcfg['eval']} without the floor")
        eval_preds = predict(core, eval_stream(dcfg["eval"]), device=device, amp_dtype=amp_dtype)
        rows = metric_rows(eval_preds, oracle_df)
        # per-row predictions on E: paired bootstrap intervals between models (gem_model.eval.model_quality)
        keep = ["request_id", "surface", "click", "p_click"] + (["p_click_raw"] if "p_click_raw" in eval_preds.columns else [])
        eval_preds.filter(pl.col("click_mask")).select(keep).write_parquet(out / EVAL_PREDICTIONS)
    summary = {
        "step": step,
        "best_step": best["step"] if dcfg["valid"] else step,
        "best_valid_score": best["score"] if dcfg["valid"] else None,
        "valid_rows": best["rows"],
        "rows": rows,
        "samples_per_s": n_samples / max(t_train, 1e-9),
        "train_seconds": t_train,
        "wall_seconds": wall,
        "loss_curve": loss_curve,
        "valid_history": valid_history,
        "param_counts": core.param_counts(),
        "hash_collisions": collisions,
        "calibration": calibrator.metadata() if calibrator is not None else None,
        "dense_stats": {"mean": core.dense_mean.tolist(), "std": core.dense_std.tolist()},
        "resumed_from_step": resumed_from,
        "warm_start": warm,
        "world_size": world,
        "device": str(device),
        "out_dir": str(out),
        "checkpoint": str(out / MODEL),
        "wandb": tracker.info() if tracker is not None else None,
    }
    final = layout.model_state(core) if rank == 0 or layout.collective else None
    save_checkpoint()
    if rank == 0:
        atomic_save({"model": final, "model_config": mcfg.to_dict(), "config": cfg,
                     "step": summary["best_step"], "rows": json.dumps(rows),
                     **({"calibration": calibrator.state()} if calibrator is not None else {})}, out / MODEL)
        atomic_write_json(cfg, out / "config.json")
        atomic_write_json({**summary, "config": cfg}, out / "metrics.json")
        if tracker is not None:
            tracker.log_metric_rows(rows, "eval", step=step)
            tracker.summary({"samples_per_s": summary["samples_per_s"], "best_valid_score": summary["best_valid_score"]})
            tracker.log_artifact(out / MODEL, f"gem-{cfg['tracking'].get('name') or 'model'}", metadata={"step": step})
            if own_tracker:
                tracker.finish()
    if own_pg:
        torch_dist.barrier()
        torch_dist.destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="JSON or YAML file with the plain-dict config")
    p.add_argument("--resume", action="store_true", help="continue from out_dir/checkpoint.pt if present")
    p.add_argument("--init-from", default=None, help="warm-start weights from this checkpoint")
    p.add_argument("--out-dir", default=None)
    a = p.parse_args(argv)
    summary = train(load_config_file(a.config), out_dir=a.out_dir, resume=a.resume, init_from=a.init_from)
    if dist_env()[0] == 0:
        print(json.dumps({k: summary[k] for k in ("step", "samples_per_s", "checkpoint", "best_valid_score")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
