"""Train GEM: a library function, a CLI, and a torchrun entry point.

    python -m gem_model.train.loop --config run.yaml [--resume]
    torchrun --nproc_per_node 2 -m gem_model.train.loop --config run.yaml

The config is a plain dict (a JSON or YAML file), checked key by key by gem_model.train.config.RunConfig.

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DDP (gloo on CPU, NCCL on GPU), or with
`train.embedding_sharding: row` its tables are sharded row-wise and the rest goes under FSDP2
(gem_model.train.sharding); every rank reads its shard of the stream; rank 0 alone logs, checkpoints and
writes files. Checkpoints hold the unsharded state and a global data position: any world size resumes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.distributed as torch_dist

from gem_model.config import FeaturesConfig, SurfacesConfig, load_features, load_surfaces
from gem_model.data.vocab import collision_rates
from gem_model.eval.metrics import metric_rows, predict, read_oracle
from gem_model.models import GEM, GEMConfig
from gem_model.models.calibration import Calibrator, calibration_days, fit_model_calibrator
from gem_model.models.registry import resolve_checkpoint
from gem_model.store import atomic
from gem_model.store.paths import gem_home, table_uri
from gem_model.train.config import load_config_file, resolve_config
from gem_model.train.distributed import destroy_process_group, init_process_group, resume_step
from gem_model.train.distributed import world as process_world
from gem_model.train.ema import WeightAverage
from gem_model.train.optim import RowWiseAdagrad
from gem_model.train.precision import autocast_dtype
from gem_model.train.sharding import ReplicatedLayout, RowShardedLayout, shard_model
from gem_model.train.startup import apply_startup_fits
from gem_model.train.streams import RunStreams
from gem_model.train.tracking import Tracker

CHECKPOINT = "checkpoint.pt"  # full resumable state, rewritten every `checkpoint_every` steps
BEST = "best.pt"  # weights of the best validation score so far
MODEL = "model.pt"  # the selected model: what downstream assets load
EVAL_PREDICTIONS = "eval_predictions.parquet"  # p_click of every clickable row of E
METRICS = "metrics.json"  # the run's summary, written last: a finished run has it

def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def _rng_state() -> dict[str, torch.Tensor]:
    """RNG states as tensors only (so checkpoints load with weights_only=True)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, _ = random.getstate()
    out = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
           "numpy_meta": torch.tensor([pos, has_gauss], dtype=torch.int64),
           "numpy_gauss": torch.tensor([gauss], dtype=torch.float64),
           "python": torch.tensor(list(py_state), dtype=torch.int64),
           "python_version": torch.tensor([version], dtype=torch.int64)}
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


def _by_name(old: torch.Tensor, own: torch.Tensor, old_in: list[str], own_in: list[str]) -> torch.Tensor | None:
    """`old`'s columns (named `old_in`) moved to where `own_in` has them, zeros for the names it lacks; None
    where the shapes say these are not those columns."""
    if old.shape[:-1] != own.shape[:-1] or (old.shape[-1], own.shape[-1]) != (len(old_in), len(own_in)):
        return None
    out = torch.zeros_like(own)
    pairs = [(k, old_in.index(name)) for k, name in enumerate(own_in) if name in old_in]
    if pairs:
        to, fro = zip(*pairs, strict=True)
        out[..., list(to)] = old[..., list(fro)].to(own.dtype)
    return out


def warm_start(model: torch.nn.Module, source: str | Path) -> tuple[dict[str, int], list[str] | None]:
    """Copy every tensor of a checkpoint whose name and shape match. Where the model's dense and wide inputs
    differ from the checkpoint's (a model option that adds a statistic, a dense feature added), the tensors
    that read them get the old columns by name and zeros for the new ones, so the model starts computing
    what the old one did. Returns counts and the window it trained on (None where it records none)."""
    ck = torch.load(resolve_checkpoint(source), map_location="cpu", weights_only=True)
    own = model.state_dict()
    loaded = {k: v for k, v in ck["model"].items() if k in own and own[k].shape == v.shape}
    remapped = 0
    if isinstance(model, GEM) and ck.get("model_config"):
        old_in, own_in = GEMConfig.from_dict(ck["model_config"]).wide_inputs, model.cfg.wide_inputs
        for k in model.wide_input_keys() if old_in != own_in else ():
            if k in ck["model"] and (v := _by_name(ck["model"][k], own[k], old_in, own_in)) is not None:
                loaded[k], remapped = v, remapped + 1
    model.load_state_dict(loaded, strict=False)
    counts = {"loaded": len(loaded) - remapped, "remapped": remapped, "skipped": len(own) - len(loaded)}
    return counts, ((ck.get("config") or {}).get("data") or {}).get("train")


def new_days(window: list[str], trained_on: list[str] | None) -> list[str]:
    """`window`'s days after the last day of `trained_on` (train.warm_days "new"); `window` itself where
    there is no such window or none of `window`'s days is new."""
    if not trained_on:
        return window
    first = max(dt.date.fromisoformat(window[0]), dt.date.fromisoformat(str(trained_on[-1])) + dt.timedelta(days=1))
    return [first.isoformat(), window[1]] if first <= dt.date.fromisoformat(window[1]) else window


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
    return float(np.average([r["ne"] for r in kept], weights=[r["positives"] for r in kept])) if kept else float("inf")


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[gem_model.train.loop] {msg}", flush=True)


@dataclass
class Run:
    cfg: dict[str, Any]  # the resolved config (gem_model.train.config.resolve_config)
    tcfg: dict[str, Any]  # cfg["train"]
    dcfg: dict[str, Any]  # cfg["data"]
    mcfg: GEMConfig
    out: Path
    rank: int
    world: int
    device: torch.device
    model: torch.nn.Module  # what the loop calls: the GEM, or its DDP / FSDP2 wrapper
    core: GEM  # the GEM itself: state, evaluation, start-up fits
    layout: ReplicatedLayout | RowShardedLayout  # how state is gathered and loaded (full, unsharded)
    opt_dense: torch.optim.Optimizer
    opt_emb: RowWiseAdagrad
    emb_lrs: list[float]  # base rate of each opt_emb group (the tables', the wide offsets')
    amp_dtype: torch.dtype | None
    streams: RunStreams
    tracker: Tracker | None = None
    lr_scale: float = 1.0  # train.warm_lr_frac on a warm start: every rate of the schedule times this
    ema: WeightAverage | None = None  # train.ema_decay: the averaged weights are validated, kept and served

    def averaged(self) -> AbstractContextManager[None]:
        """The model holds the weights a validation scores and best.pt keeps: the average, if there is one."""
        return self.ema.swapped() if self.ema is not None else nullcontext()

    def averaged_state(self) -> dict[str, torch.Tensor]:
        """A copy of the full state with the averaged weights (a state_dict holds the live tensors themselves)."""
        if self.ema is None:
            return self.layout.model_state(self.core)
        with self.ema.swapped():
            return {k: v.detach().clone() for k, v in self.layout.model_state(self.core).items()}

    @property
    def takes_part(self) -> bool:
        """Rank 0, or every rank under a sharded layout (gathers and forwards are collective)."""
        return self.rank == 0 or self.layout.collective

    def say(self, msg: str) -> None:
        _say(self.rank, msg)


@dataclass
class State:
    step: int = 0
    epoch: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"score": float("inf"), "step": -1, "evals_since": 0, "rows": []})
    loss_curve: list[list[float]] = field(default_factory=list)
    valid_history: list[list[float]] = field(default_factory=list)
    resumed_from: int | None = None
    n_samples: int = 0
    t_train: float = 0.0


def setup(cfg: dict[str, Any], *, init_from: str | Path | None, resume: bool, features: FeaturesConfig,
          surfaces: SurfacesConfig) -> tuple[Run, dict[str, int] | None]:
    """Device and process group, seeds, the model (warm-started, compiled, wrapped), its optimizers, the
    data streams and the start-up fits. Returns the run and the warm start's counts (None: fresh)."""
    tcfg, dcfg, out = cfg["train"], cfg["data"], Path(cfg["out_dir"])
    rank, world = process_world()
    device = pick_device(cfg["device"], int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":  # TF32 for fp32 matmuls (cuBLAS and the Triton kernels' dots)
        torch.set_float32_matmul_precision("high")
    if tcfg["torch_threads"]:
        torch.set_num_threads(int(tcfg["torch_threads"]))
    elif world > 1 and device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.manual_seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    random.seed(cfg["seed"])

    mcfg = GEMConfig.from_specs(cfg["model"], features=features, surfaces=surfaces, surface_names=dcfg["surfaces"])
    sharded = world > 1 and tcfg["embedding_sharding"] == "row"
    layout = RowShardedLayout() if sharded else ReplicatedLayout()
    model = GEM(mcfg) if sharded else GEM(mcfg).to(device)  # sharded: only this rank's part reaches the device
    warm = None
    if init_from:
        warm, trained_on = warm_start(model, init_from)
        if tcfg["warm_days"] == "new":  # before the streams read the window; cfg (config.json) records it
            dcfg["train"] = new_days(dcfg["train"], trained_on)
    core = model
    if tcfg["compile"]:  # the inductor cache lives under GEM_HOME: warm starts compile in seconds
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(gem_home() / "torch_compile_cache"))
        core.compile_dense()
    if sharded:
        shard_model(model, device=device)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    opt_dense = torch.optim.AdamW(core.dense_parameters(), lr=tcfg["lr"], weight_decay=tcfg["weight_decay"], betas=(0.9, 0.98),
                                  fused=device.type == "cuda" or None)  # one kernel for every parameter on CUDA
    wide_wd = tcfg["emb_weight_decay"] if tcfg["wide_weight_decay"] is None else tcfg["wide_weight_decay"]
    opt_emb = RowWiseAdagrad([{"params": list(core.tables.parameters())},  # core.embedding_parameters(), in two groups
                              {"params": list(core.wide_tables.parameters()), "weight_decay": float(wide_wd)}],
                             lr=tcfg["emb_lr"], weight_decay=tcfg["emb_weight_decay"])
    # a logistic regression's rate for the wide offsets (a linear model on ids), the tables' own for the rest
    emb_lrs = [float(tcfg["emb_lr"]), float(tcfg["emb_lr"] if tcfg["wide_lr"] is None else tcfg["wide_lr"])]

    streams = RunStreams(dcfg, tcfg, features=features, surfaces=surfaces, max_len=mcfg.seq_len, device=device,
                         seed=cfg["seed"], rank=rank, world=world)
    apply_startup_fits(core, tcfg, streams, warm=init_from is not None, resuming=resume and (out / CHECKPOINT).exists(),
                       sharded=sharded, say=lambda msg: _say(rank, msg))
    run = Run(cfg, tcfg, dcfg, mcfg, out, rank, world, device, model, core, layout, opt_dense, opt_emb, emb_lrs,
              autocast_dtype(str(tcfg["precision"]), device), streams,
              lr_scale=float(tcfg["warm_lr_frac"]) if init_from else 1.0,
              ema=WeightAverage(core, float(tcfg["ema_decay"])) if tcfg["ema_decay"] else None)
    return run, warm


def save_checkpoint(run: Run, st: State) -> None:
    """Rank 0 writes; under a sharded layout every rank takes part in gathering the state."""
    if not run.takes_part:
        return
    stream = run.streams.train
    ck = {
        "model": run.layout.model_state(run.core),
        "opt_dense": run.layout.optim_state(run.opt_dense),
        "opt_emb": run.layout.optim_state(run.opt_emb),
        "step": st.step,
        "epoch": stream.epoch,
        "data_position": stream.position,
        "global_position": stream.global_position,
        "world_size": run.world,
        "rng": _rng_state(),
        "best": json.dumps(st.best),
        "loss_curve": torch.tensor(st.loss_curve, dtype=torch.float64).reshape(-1, 2),
        "valid_history": torch.tensor(st.valid_history, dtype=torch.float64).reshape(-1, 2),
        "config": run.cfg,
        "model_config": run.mcfg.to_dict(),
    }
    if run.ema is not None:
        ck["ema"] = run.averaged_state()
        ck["ema_updates"] = run.ema.updates
    if run.rank == 0:
        atomic.torch_save(ck, run.out / CHECKPOINT)


def load_checkpoint(run: Run, path: Path) -> State:
    """The state of an interrupted run; the data position is global, so any world size resumes it."""
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if run.ema is not None:  # the average first, through the model (the layout shards it), then the live weights
        run.layout.load_model_state(run.core, ck.get("ema", ck["model"]))
        run.ema.reset()
        run.ema.updates = int(ck.get("ema_updates", 0))
    run.layout.load_model_state(run.core, ck["model"])
    run.layout.load_optim_state(run.opt_dense, ck["opt_dense"])
    run.layout.load_optim_state(run.opt_emb, ck["opt_emb"])
    saved_world = int(ck.get("world_size", run.world))  # a step is one batch per rank
    step, epoch = resume_step(int(ck["step"]), saved_world, run.world), int(ck["epoch"])
    stream = run.streams.train
    stream.load_state_dict({"epoch": epoch, "global_position": int(ck.get("global_position", int(ck["data_position"]) * saved_world))})
    _set_rng_state(ck["rng"])
    run.say(f"resumed from {path} at step {step} (epoch {epoch}, global batch {stream.global_position}, "
            f"saved by world size {saved_world})")
    return State(step=step, epoch=epoch, best=json.loads(ck["best"]), loss_curve=ck["loss_curve"].tolist(),
                 valid_history=ck["valid_history"].tolist(), resumed_from=step)


def predict_day(run: Run, day: str) -> pl.DataFrame:
    return predict(run.core, run.streams.day(day), device=run.device, amp_dtype=run.amp_dtype)


def validate(run: Run, st: State) -> None:
    """Score E-1 (NE weighted by positives); a better score writes best.pt, a worse one counts toward patience."""
    if not run.dcfg["valid"]:
        return
    with run.averaged():
        rows = metric_rows(predict_day(run, run.dcfg["valid"]))
    score = _score(rows)
    st.valid_history.append([float(st.step), score])
    if run.tracker is not None:
        run.tracker.log({"valid/mean_ne": score}, step=st.step)
        run.tracker.log_metric_rows(rows, "valid", step=st.step)
    if score < st.best["score"]:
        st.best.update(score=score, step=st.step, evals_since=0, rows=rows)
        state = run.averaged_state() if run.takes_part else None
        if run.rank == 0:
            atomic.torch_save({"model": state, "model_config": run.mcfg.to_dict(), "config": run.cfg, "step": st.step},
                              run.out / BEST)
    else:
        st.best["evals_since"] += 1
    run.say(f"valid step {st.step}: mean NE {score:.4f} (best {st.best['score']:.4f} at step {st.best['step']})")


def train_loop(run: Run, st: State, total_steps: int) -> None:
    tcfg, core, stream, device = run.tcfg, run.core, run.streams.train, run.device
    amp_dtype, patience = run.amp_dtype, int(tcfg["patience"])
    epochs = int(tcfg["epochs"]) if not tcfg["max_steps"] else 10**9
    log_loss_sum: torch.Tensor | float = 0.0  # summed on the device, read back every log_every steps
    # resumed from a checkpoint written where patience ran out: the loop had finished
    log_n, stop = 0, st.best["evals_since"] > patience
    run.model.train()
    while st.epoch < epochs and not stop and st.step < total_steps:
        tick = time.perf_counter()
        for batch in stream:
            batch = batch.to(device, non_blocking=True)
            f = lr_factor(st.step, int(tcfg["warmup_steps"]), total_steps, float(tcfg["min_lr_frac"])) * run.lr_scale
            for g in run.opt_dense.param_groups:
                g["lr"] = tcfg["lr"] * f
            for g, base_lr in zip(run.opt_emb.param_groups, run.emb_lrs, strict=True):
                g["lr"] = base_lr * f
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                logits = run.model(batch)
            loss, parts = core.loss(logits, batch)
            run.opt_dense.zero_grad(set_to_none=True)
            run.opt_emb.zero_grad(set_to_none=True)
            loss.backward()
            run.layout.after_backward(core)
            if tcfg["grad_clip"]:
                run.layout.clip_grad_norm_(core.dense_parameters(), float(tcfg["grad_clip"]))
            run.opt_dense.step()
            run.opt_emb.step()
            if run.ema is not None:
                run.ema.update()
            st.step += 1
            st.n_samples += len(batch) * run.world
            log_loss_sum = log_loss_sum + loss.detach()
            log_n += 1
            if st.step % int(tcfg["log_every"]) == 0 or st.step == total_steps:
                st.t_train += time.perf_counter() - tick
                tick = time.perf_counter()
                avg, sps = float(log_loss_sum) / max(1, log_n), st.n_samples / max(st.t_train, 1e-9)
                st.loss_curve.append([float(st.step), avg])
                run.say(f"step {st.step}/{total_steps} epoch {stream.epoch} loss {avg:.4f} lr {tcfg['lr'] * f:.2e} "
                        f"{sps:,.0f} samples/s")
                if run.tracker is not None:
                    run.tracker.log({"train/loss": avg, "train/lr": tcfg["lr"] * f, "train/samples_per_s": sps,
                                     **{f"train/loss_{k}": float(v) for k, v in parts.items()}}, step=st.step)
                log_loss_sum, log_n = 0.0, 0
            if tcfg["eval_every"] and st.step % int(tcfg["eval_every"]) == 0:
                st.t_train += time.perf_counter() - tick
                validate(run, st)
                tick = time.perf_counter()
            if st.step % int(tcfg["checkpoint_every"]) == 0:
                save_checkpoint(run, st)
            if tcfg["fail_at_step"] and st.step == int(tcfg["fail_at_step"]):
                if tcfg["fail_with"] == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if tcfg["fail_with"] == "sigkill_group":
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                raise RuntimeError(f"simulated failure at step {st.step} (train.fail_at_step)")
            if st.step >= total_steps or st.best["evals_since"] > patience:
                stop = True
                break
        st.t_train += time.perf_counter() - tick
        if stop:
            break
        st.epoch += 1
        if not tcfg["eval_every"]:
            validate(run, st)
            if st.best["evals_since"] > patience:
                run.say(f"early stopping after epoch {st.epoch}")
                stop = True
        stream.set_epoch(st.epoch)
        save_checkpoint(run, st)
    if run.dcfg["valid"] and (not st.valid_history or st.valid_history[-1][0] != st.step):
        validate(run, st)
    if run.ema is not None and not run.dcfg["valid"]:  # nothing selects among versions: the average is the model
        run.ema.copy_to_model()


def select_and_calibrate(run: Run) -> Calibrator | None:
    """Load the best E-1 weights; fit the post-hoc Platt map per (surface, task) on the selected model's
    predictions of every day after its window up to E-1 (gem_model.models.calibration)."""
    tcfg, dcfg = run.tcfg, run.dcfg
    if not (run.takes_part and dcfg["valid"]):
        return None
    if (run.out / BEST).exists():
        run.layout.load_model_state(run.core, torch.load(run.out / BEST, map_location="cpu", weights_only=True)["model"])
    if not tcfg["calibrate"]:
        return None
    calibrator = fit_model_calibrator(
        lambda day: predict_day(run, day), calibration_days(dcfg["train"][1], dcfg["valid"]), list(run.core.cfg.surfaces),
        min_positives=int(tcfg["calibration_min_positives"]), shrink_positives=float(tcfg["calibration_shrink_positives"]),
        level_positives=tcfg["calibration_level_positives"])
    run.core.calibrator = calibrator  # metrics.predict applies it from here on
    run.say(f"calibrator fitted on {calibrator.fit_day}: {int(calibrator.fitted.sum())} of {calibrator.fitted.numel()} "
            f"heads (others: identity, < {tcfg['calibration_min_positives']} positives)")
    return calibrator


def evaluate(run: Run) -> list[dict[str, Any]]:
    """Metrics on E (with the oracle's floor when the lake has one); writes E's per-row predictions, from
    which gem_model.eval.model_quality draws paired bootstrap intervals between models."""
    dcfg = run.dcfg
    if not (run.takes_part and dcfg["eval"]):  # sharded: every rank takes part in the forward
        return []
    oracle_df = None
    if dcfg["oracle"]:
        oracle_df = read_oracle([dcfg["eval"]], dcfg["surfaces"], uri=table_uri("oracle", dcfg["lake"]),
                                storage_options=run.streams.storage_options, missing_ok=True)
        if oracle_df is None:  # real logs
            run.say(f"no oracle table in this lake: metrics on {dcfg['eval']} without the floor")
    preds = predict_day(run, dcfg["eval"])
    keep = ["request_id", "surface", "click", "p_click"] + (["p_click_raw"] if "p_click_raw" in preds.columns else [])
    with atomic.atomic_path(run.out / EVAL_PREDICTIONS) as tmp:
        preds.filter(pl.col("click_mask")).select(keep).write_parquet(tmp)
    return metric_rows(preds, oracle_df)


def write_outputs(run: Run, st: State, summary: dict[str, Any], calibrator: Calibrator | None) -> None:
    """checkpoint.pt (the final state), then on rank 0 model.pt (the selected weights), config.json, metrics.json."""
    final = run.layout.model_state(run.core) if run.takes_part else None
    save_checkpoint(run, st)
    if run.rank != 0:
        return
    cfg, out = run.cfg, run.out
    atomic.torch_save({"model": final, "model_config": run.mcfg.to_dict(), "config": cfg, "step": summary["best_step"],
                       "rows": json.dumps(summary["rows"]), **({"calibration": calibrator.state()} if calibrator else {})},
                      out / MODEL)
    atomic.write_json(out / "config.json", cfg)
    atomic.write_json(out / METRICS, {**summary, "config": cfg})
    if run.tracker is not None:
        run.tracker.log_metric_rows(summary["rows"], "eval", step=st.step)
        run.tracker.summary({"samples_per_s": summary["samples_per_s"], "best_valid_score": summary["best_valid_score"]})
        run.tracker.log_artifact(out / MODEL, f"gem-{cfg['tracking'].get('name') or 'model'}", metadata={"step": st.step})


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
    own_pg = init_process_group(cfg["device"])  # under torchrun; torch.distributed may be set up by the caller
    run, warm = setup(cfg, init_from=init_from, resume=resume, features=features or load_features(),
                      surfaces=surfaces or load_surfaces())
    tcfg, dcfg, core, stream = run.tcfg, run.dcfg, run.core, run.streams.train

    # -- the state: resumed, or fresh ----------------------------------------------------------------
    if resume and (run.out / CHECKPOINT).exists():
        st = load_checkpoint(run, run.out / CHECKPOINT)
    else:
        st = State()
        stream.set_epoch(0)
    own_tracker = tracker is None and run.rank == 0
    if own_tracker:
        tracker = Tracker(**cfg["tracking"], config=cfg)
    run.tracker = tracker
    if warm is not None and st.step == 0:  # the loaded weights are a candidate: a retrain never serves worse ones
        validate(run, st)
    total_steps = int(tcfg["max_steps"] or max(1, stream.count_rows() // (tcfg["batch_size"] * run.world) * int(tcfg["epochs"])))

    # -- the loop ------------------------------------------------------------------------------------
    run.say(f"{core.param_counts()} params; {total_steps} steps; device {run.device}; world {run.world}")
    t0 = time.perf_counter()
    train_loop(run, st, total_steps)
    wall = time.perf_counter() - t0
    if run.world > 1:  # DDP syncs buffers (BatchNorm statistics) from rank 0 before each forward: finish that
        for buf in core.buffers():
            torch_dist.broadcast(buf, 0)
    if tcfg["dump_rank_weights"]:  # tests: every rank's final weights, before selection
        atomic.torch_save(run.layout.model_state(core), run.out / f"rank{run.rank}.pt")

    # -- finish: select, calibrate, evaluate, write -------------------------------------------------------
    calibrator = select_and_calibrate(run)
    rows = evaluate(run)
    summary = {
        "step": st.step,
        "best_step": st.best["step"] if dcfg["valid"] else st.step,
        "best_valid_score": st.best["score"] if dcfg["valid"] else None,
        "valid_rows": st.best["rows"],
        "rows": rows,
        "samples_per_s": st.n_samples / max(st.t_train, 1e-9),
        "train_seconds": st.t_train,
        "wall_seconds": wall,
        "loss_curve": st.loss_curve,
        "valid_history": st.valid_history,
        "param_counts": core.param_counts(),
        "hash_collisions": collision_rates(run.streams.uri, run.streams.days, dcfg["surfaces"], run.streams.features,
                                           run.streams.storage_options) if run.rank == 0 else {},
        "calibration": calibrator.metadata() if calibrator is not None else None,
        "dense_stats": {"mean": core.dense_mean.tolist(), "std": core.dense_std.tolist()},
        "resumed_from_step": st.resumed_from,
        "warm_start": warm,
        "world_size": run.world,
        "device": str(run.device),
        "out_dir": str(run.out),
        "checkpoint": str(run.out / MODEL),
        "wandb": tracker.info() if tracker is not None else None,
    }
    write_outputs(run, st, summary, calibrator)
    if own_tracker and tracker is not None:
        tracker.finish()
    if own_pg:
        destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="JSON or YAML file with the plain-dict config")
    p.add_argument("--resume", action="store_true", help="continue from out_dir/checkpoint.pt if present")
    p.add_argument("--init-from", default=None, help="warm-start weights from this checkpoint")
    p.add_argument("--out-dir", default=None)
    a = p.parse_args(argv)
    summary = train(load_config_file(a.config), out_dir=a.out_dir, resume=a.resume, init_from=a.init_from)
    if process_world()[0] == 0:
        print(json.dumps({k: summary[k] for k in ("step", "samples_per_s", "checkpoint", "best_valid_score")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
