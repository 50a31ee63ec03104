"""Training one student: the per-arm losses, seeded minibatch SGD over in-memory tensors, epoch
selection on the validation day (E-1) by click log loss (= click NE ordering on a fixed day).

A trained student gets its own calibrator (`fit_student_calibrator`: a Platt map per task on its raw
predictions of E-1, shrunk toward the identity by positives, gem_model.models.calibration), saved with
its weights and applied by `predict_student`, so its gate compares calibrated with calibrated."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from gem_model.distill.arms import arm_spec
from gem_model.distill.dataset import StudentData
from gem_model.distill.resumable import fail_if_asked, load_state, save_state
from gem_model.distill.student import Student, share_tables
from gem_model.eval.metrics import task_columns
from gem_model.models.calibration import DEFAULT_CALIBRATION, Calibrator, fit_calibrator
from gem_model.store import atomic
from gem_model.train.optim import RowWiseAdagrad
from gem_model.train.precision import autocast_dtype


def masked_bce(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over tasks of the mean BCE over each task's masked rows (target may be soft)."""
    target = torch.nan_to_num(target, nan=0.0).clamp(0.0, 1.0)
    bce = F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="none")
    m = mask.float()
    return ((bce * m).sum(0) / m.sum(0).clamp_min(1.0)).sum()


def student_inputs(model: Student, data: StudentData) -> tuple[torch.Tensor, ...]:
    args: list[Any] = [data.dense, data.sparse, data.hist_ids if model.hist_k > 0 else None]
    if model.teacher_emb_dim > 0:
        if data.teacher_emb is None:
            raise ValueError("a representation student needs teacher embeddings (attach_teacher)")
        args.append(data.teacher_emb)
    return tuple(args)


def kd_target(data: StudentData, adapter: Any | None) -> torch.Tensor:
    return adapter.transform(data) if adapter is not None else data.teacher_p


def arm_loss(
    model: Student, data: StudentData, arm: str, kd_weight: float, target: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one minibatch for `arm`, with its parts."""
    spec = arm_spec(arm)
    serving, aux = model.forward_train(*student_inputs(model, data))
    label_loss = masked_bce(serving, data.labels, data.label_mask)
    parts = {"label": float(label_loss.detach())}
    if spec["kd"] == "none":
        return label_loss, parts
    assert target is not None
    kd_mask = data.label_mask & ~torch.isnan(target)  # label_mask: the surface logs the task
    kd = masked_bce(serving if spec["kd"] == "single" else aux, target, kd_mask)
    parts["kd"] = float(kd.detach())
    return label_loss + kd_weight * kd, parts


@torch.no_grad()
def predict_student(model: Student, data: StudentData, batch_size: int = 8192, *, calibrated: bool = True) -> np.ndarray:
    """Serving probabilities [N, 2] (computed on the model's device): through the student's own
    calibrator when it carries one (`model.calibrator`) and `calibrated`, else sigmoid(logits)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    cal: Calibrator | None = getattr(model, "calibrator", None) if calibrated else None
    out = []
    for i in range(0, len(data), batch_size):
        part = data.take(np.arange(i, min(i + batch_size, len(data)))).to(device)
        logits = model(*student_inputs(model, part)).float()
        p = cal.apply_logits(logits, torch.zeros(len(logits), dtype=torch.long, device=device)) if cal is not None \
            else torch.sigmoid(logits)
        out.append(p.cpu().numpy())
    model.train(was)
    return np.concatenate(out) if out else np.zeros((0, 2), np.float32)


def preds_frame(data: StudentData, p: np.ndarray, surface: str, raw: np.ndarray | None = None) -> pl.DataFrame:
    """The `gem_model.eval.metrics.predict` layout (raw: before the student's calibrator)."""
    return pl.DataFrame(
        {
            "request_id": pl.Series(data.request_ids.tolist(), dtype=pl.String),
            "surface": [surface] * len(data),
            **task_columns(data.labels.numpy().astype(np.float64), data.label_mask.numpy(), p, raw),
        }
    )


def fit_student_calibrator(model: Student, val: StudentData, fit_day: str | None = None) -> Calibrator:
    """The student's own Platt map per task from its raw predictions of `val` (E-1): one surface,
    so each map is shrunk toward the identity (its targets were the teacher's calibrated
    probabilities) with the weight positives / (positives + shrink_positives), then shifted toward its
    own click rate (level_positives, gem_model.models.calibration)."""
    surface = str(model.cfg["surface"])
    preds = preds_frame(val, predict_student(model, val, calibrated=False), surface)
    return fit_calibrator(preds, [surface], min_positives=DEFAULT_CALIBRATION["min_positives"], fit_day=fit_day,
                          shrink_positives=DEFAULT_CALIBRATION["shrink_positives"], prior="identity",
                          level_positives=DEFAULT_CALIBRATION["level_positives"])


def table_rows(model: Student, data: StudentData) -> dict[str, torch.Tensor]:
    """{table: sorted rows met in `data`} (the sparse columns and, with hist_k > 0, the history ids)."""
    out: dict[str, list[torch.Tensor]] = {}
    for j, (_, table) in enumerate(model.cfg["sparse_features"]):
        out.setdefault(table, []).append(data.sparse[:, j].long())
    if model.hist_k > 0:
        out.setdefault(model.cfg["hist_table"], []).append(data.hist_ids.long().flatten())
    return {t: torch.unique(torch.cat(v)) for t, v in out.items()}


def merge_rows(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {t: torch.unique(torch.cat([d[t] for d in (a, b) if t in d])) for t in set(a) | set(b)}


def click_logloss(p: np.ndarray, data: StudentData) -> float:
    m = data.label_mask[:, 0].numpy()
    y = data.labels[:, 0].numpy()[m]
    q = np.clip(p[m, 0].astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-(y * np.log(q) + (1 - y) * np.log1p(-q)).mean()) if m.any() else float("nan")


def train_student(
    model: Student,
    train: StudentData,
    val: StudentData | None,
    arm: str,
    train_cfg: dict[str, Any],
    *,
    seed: int = 0,
    adapter: Any | None = None,
    teacher_model: torch.nn.Module | None = None,
    log: Any | None = None,
    device: torch.device | str | None = None,
    precision: str = "fp32",
    keep_start: bool = False,
    checkpoint: str | Path | None = None,
) -> dict[str, Any]:
    """Train `model` in place for `arm`; returns info (losses per step, copied tables, the epoch
    kept). The state kept is the epoch with the lowest click log loss on `val` (E-1); with
    `keep_start` (a warm start) the starting weights are a candidate too (epoch_kept -1): a retrain
    whose fresh optimizers knock a trained student off its minimum never replaces it with worse weights.

    train_cfg: a preset's `train` section (batch_size, epochs, max_steps, lr, emb_lr, kd_weight,
    share_tables, torch_threads). adapter: a fitted StudentAdapter (student_adapter and later arms).
    teacher_model: the module whose `tables` parameter sharing copies. log: f(dict, step=) or None.
    device: where to train (the accelerator resource's; default: where the model is); the model goes
    back to its own device afterwards (saving and export read it there). precision: fp32 | bf16 |
    auto, autocast around the forward (the losses are fp32). checkpoint: where the resumable state (weights,
    optimizers, data order and position, the best epoch so far, RNG) is written every `checkpoint_every` steps;
    when it exists, training continues from it (a retried or re-executed run) as if never interrupted."""
    before = torch.get_num_threads()
    if train_cfg.get("torch_threads"):
        torch.set_num_threads(int(train_cfg["torch_threads"]))
    try:
        return _train_student(model, train, val, arm, train_cfg, seed, adapter, teacher_model, log, device, precision,
                              keep_start, Path(checkpoint) if checkpoint is not None else None)
    finally:
        torch.set_num_threads(before)


def _train_student(model: Student, train: StudentData, val: StudentData | None, arm: str, train_cfg: dict[str, Any],
                   seed: int, adapter: Any | None, teacher_model: torch.nn.Module | None, log: Any | None,
                   device: torch.device | str | None, precision: str, keep_start: bool = False,
                   checkpoint: Path | None = None) -> dict[str, Any]:
    spec = arm_spec(arm)
    torch.manual_seed(seed)
    model.calibrator = None  # a map fitted on other weights is stale: fit_student_calibrator after training
    info: dict[str, Any] = {"arm": arm, "seed": seed, "copied_tables": [], "losses": []}
    if spec["share_tables"]:
        if teacher_model is None:
            raise ValueError(f"arm {arm!r} copies the teacher's tables: pass teacher_model")
        info["copied_tables"] = share_tables(model, teacher_model, list(train_cfg.get("share_tables", [])))
    if spec["kd"] != "none" and train.teacher_p is None:
        raise ValueError(f"arm {arm!r} needs teacher predictions on the training rows")
    if spec["adapter"] and adapter is None:
        raise ValueError(f"arm {arm!r} needs a fitted StudentAdapter")
    target_all = kd_target(train, adapter if spec["adapter"] else None) if spec["kd"] != "none" else None
    if not keep_start:  # a warm start keeps the statistics its weights were trained under
        model.set_dense_stats(train.dense)
    home = next(model.parameters()).device
    dev = torch.device(device) if device is not None else home
    model.to(dev)  # before the optimisers: they hold the parameters of the device they train on
    amp_dtype = autocast_dtype(precision, dev)

    emb = list(model.tables.parameters())
    emb_ids = {id(p) for p in emb}
    dense = [p for p in model.parameters() if id(p) not in emb_ids]
    opts = [torch.optim.Adam(dense, lr=float(train_cfg["lr"]), weight_decay=float(train_cfg.get("weight_decay", 0)))]
    if float(train_cfg.get("emb_lr", 0.05)) > 0:  # row-wise Adagrad on the tables, as the teacher
        opts.append(RowWiseAdagrad(emb, lr=float(train_cfg.get("emb_lr", 0.05))))
    bs = int(train_cfg["batch_size"])
    max_steps = train_cfg.get("max_steps")
    gen = torch.Generator().manual_seed(seed)
    best: tuple[float, dict[str, torch.Tensor] | None, int] = (float("inf"), None, -1)
    if keep_start and val is not None and len(val):
        best = (click_logloss(predict_student(model, val, calibrated=False), val), copy.deepcopy(model.state_dict()), -1)
    step, first_epoch, first_batch, t0 = 0, 0, 0, time.perf_counter()
    state = load_state(checkpoint, model, opts) if checkpoint is not None and checkpoint.is_file() else None
    if state is not None:
        gen.set_state(state["gen"])  # at the start of its epoch: that epoch's order is drawn again
        step, first_epoch, first_batch = int(state["step"]), int(state["epoch"]), int(state["next"])
        info["losses"] = state["losses"].tolist()
        best = (float(state["best_ll"]), state["best_weights"], int(state["best_epoch"]))
    model.train()
    for epoch in range(first_epoch, int(train_cfg["epochs"])):
        epoch_gen = gen.get_state()  # a resumed run draws this epoch's order again from here
        order = torch.randperm(len(train), generator=gen)
        for i in range(first_batch if epoch == first_epoch else 0, len(train) - bs + 1 if len(train) >= bs else 1, bs):
            if max_steps is not None and step >= int(max_steps):  # resumed from the last step's checkpoint
                break
            idx = order[i : i + bs]
            part = train.take(idx).to(dev)
            target = target_all[idx].to(dev) if target_all is not None else None
            with torch.autocast(dev.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                loss, parts = arm_loss(model, part, arm, float(train_cfg.get("kd_weight", 1.0)), target)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in opts:
                opt.step()
            info["losses"].append(float(loss.detach()))
            if log is not None and step % 20 == 0:
                log({"loss": float(loss.detach()), **{f"loss/{k}": v for k, v in parts.items()}}, step=step)
            step += 1
            if checkpoint is not None and step % int(train_cfg["checkpoint_every"]) == 0:
                save_state(checkpoint, model, opts, step=step, epoch=epoch, next=i + bs, gen=epoch_gen,
                           losses=torch.tensor(info["losses"], dtype=torch.float64), best_ll=best[0],
                           best_weights=best[1], best_epoch=best[2])
            fail_if_asked(train_cfg, step, "train")
            if max_steps is not None and step >= int(max_steps):
                break
        if val is not None and len(val):
            ll = click_logloss(predict_student(model, val, calibrated=False), val)
            if ll < best[0] or best[1] is None:
                best = (ll, copy.deepcopy(model.state_dict()), epoch)
        if max_steps is not None and step >= int(max_steps):
            break
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.to(home)
    # the rows its data reached (with those of the student it warm-started from): the next warm start
    # folds the rows it has never seen into them (warm_start.fold_in_student)
    model.seen_rows = merge_rows(getattr(model, "seen_rows", None) or {}, table_rows(model, train))
    info.update(steps=step, epoch_kept=best[2], val_click_logloss=best[0] if best[1] is not None else None,
                train_seconds=time.perf_counter() - t0, resumed_from_step=int(state["step"]) if state else None)
    return info


# ------------------------------------------------------------------------------------------------
# Saving / loading (weights_only-safe: config is a plain dict)


def save_student(model: Student, directory: str | Path, metrics: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> Path:
    """Atomically write model.pt ({"state_dict", "config", "calibration" when the student has its
    calibrator, "seen_rows" {table: rows its training data reached}}; weights_only-safe), config.json
    and metrics.json."""
    d = Path(directory)
    cal: Calibrator | None = getattr(model, "calibrator", None)
    seen = getattr(model, "seen_rows", None)
    atomic.torch_save({"state_dict": model.state_dict(), "config": dict(model.cfg),
                       **({"calibration": cal.state()} if cal is not None else {}),
                       **({"seen_rows": dict(seen)} if seen else {})}, d / "model.pt")
    atomic.write_json(d / "config.json", {"student": model.cfg, **(extra or {})})
    atomic.write_json(d / "metrics.json", metrics or {})
    return d


def load_student(directory_or_file: str | Path) -> Student:
    p = Path(directory_or_file)
    ckpt = torch.load(p / "model.pt" if p.is_dir() else p, map_location="cpu", weights_only=True)
    model = Student(ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    if ckpt.get("calibration"):  # its own map (fit_student_calibrator); predict_student applies it
        model.calibrator = Calibrator.from_state(ckpt["calibration"])
    return model
