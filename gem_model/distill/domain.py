"""Domain foundation models: the teacher architecture, initialised from the foundation checkpoint,
distilled from the foundation's `teacher_predictions` on the domain's surfaces over the student
window (up to E-2). Their teacher name is "domain:<name>".

With churn, the ads born between the foundation's window and the end of the student window start the training
placed in the item basis (`fold_in`: the foundation's train config; gem_model.distill.serving_fold_in.fold_through),
and the saved config carries the domain model's own window and the foundation's `train.item_svd`, so
`teacher_predictions` serves it as it serves the foundation: the ads born since folded in, a map per fold status.

A domain model carries its own calibrator (gem_model.models.calibration), never the foundation's: its
logits moved in training. It is fitted on E-1 (the day after its window), each surface's map shrunk
toward the map pooled over the domain's surfaces, and saved with its weights, so its quality gate and
the hierarchical path's distillation targets read its own calibrated probabilities."""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.config import SurfacesConfig, load_calendar, load_surfaces
from gem_model.data.loader import ExampleStream, date_range
from gem_model.distill.config import load_student_preset
from gem_model.distill.resumable import fail_if_asked, load_state, save_state
from gem_model.distill.serving_fold_in import fold_through
from gem_model.distill.teacher import FOUNDATION, domain_teacher, read_teacher_predictions
from gem_model.distill.trainer import masked_bce
from gem_model.eval.metrics import predict
from gem_model.models.calibration import DEFAULT_CALIBRATION, Calibrator, fit_model_calibrator
from gem_model.store import atomic
from gem_model.store.paths import models_dir
from gem_model.train.loop import MODEL
from gem_model.train.precision import autocast_dtype


def teacher_targets(tp: pl.DataFrame, request_ids: Sequence[str]) -> torch.Tensor:
    """[B, 2] teacher probabilities for `request_ids` (NaN where missing), order kept."""
    left = pl.DataFrame({"request_id": pl.Series(list(request_ids), dtype=pl.String)})
    j = left.join(tp.select("request_id", "p_click", "p_conversion"), on="request_id", how="left", maintain_order="left")
    p = np.stack([j["p_click"].fill_null(np.nan).to_numpy(), j["p_conversion"].fill_null(np.nan).to_numpy()], 1)
    return torch.from_numpy(p.astype(np.float32))


def distill_loss(model: Any, logits: torch.Tensor, batch: Any, target: torch.Tensor, kd_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """GEM label loss + kd_weight * BCE(sigmoid(logits), p_teacher) on the allowed tasks."""
    label_loss, _ = model.loss(logits, batch)
    kd = masked_bce(logits, target, model.task_allowed[batch.surface_idx] & ~torch.isnan(target))
    return label_loss + kd_weight * kd, {"label": float(label_loss.detach()), "kd": float(kd.detach())}


def train_domain_model(
    domain: str,
    foundation: torch.nn.Module,
    *,
    teacher_predictions: pl.DataFrame | None = None,
    dates: tuple[dt.date, dt.date] | None = None,
    preset: str = "small",
    overrides: dict[str, Any] | None = None,
    uri: str | None = None,
    tp_uri: str | None = None,
    log: Any | None = None,
    device: torch.device | str | None = None,
    precision: str = "auto",
    fold_in: dict[str, Any] | None = None,
    checkpoint: str | Path | None = None,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train the domain model of `domain` and return (model, info).

    foundation: the foundation GEM (already loaded, e.g. with gem_model.models.registry.load_model);
    the domain model is a deep copy of it (same architecture, every weight initialised from it).
    teacher_predictions: the foundation's predictions for `dates` (default: read the
    teacher_predictions table at `tp_uri`). dates: inclusive student window (default: calendar
    roles().student). uri: training_examples table (default: the lake's). device: where to train
    (the accelerator resource's; default: the foundation's); precision: auto | bf16 | fp32 (autocast).
    fold_in: the foundation's train config (load_model's second value): the ids first met after its window and
    up to the end of `dates` are folded in before training, and info carries the domain model's window and
    serving options (module doc); None: neither. Its own calibrator is fitted on the day after `dates` (E-1).
    checkpoint: where the resumable state is written every `checkpoint_every` steps; when it exists, training
    continues from it (a killed run's re-execution) instead of from the start."""
    surfaces_config = load_surfaces()
    names = [s.name for s in surfaces_config.in_domain(domain)]
    if not names:
        raise ValueError(f"domain {domain!r} has no surfaces; domains: {surfaces_config.domains}")
    hp = load_student_preset(preset, overrides=overrides)["domain"]
    if dates is None:
        dates = load_calendar().roles().student
    if teacher_predictions is None:
        teacher_predictions = read_teacher_predictions(date_range(*dates), [FOUNDATION], uri=tp_uri, embeddings=False)
    tp = teacher_predictions.filter(pl.col("teacher") == FOUNDATION)
    if tp.height == 0:
        raise ValueError("no foundation teacher predictions to distil from")

    torch.manual_seed(0)
    device = torch.device(device) if device is not None else next(foundation.parameters()).device
    model = copy.deepcopy(foundation).to(device).train()
    model.calibrator = None  # the foundation's map is not this model's: it gets its own after training
    folded = fold_through(model, fold_in, dates[1] + dt.timedelta(days=1), uri=uri) if fold_in else None
    amp_dtype = autocast_dtype(precision, device)
    opt = torch.optim.Adam(model.parameters(), lr=float(hp["lr"]))
    stream = ExampleStream(dates[0], dates[1], names, batch_size=int(hp["batch_size"]), uri=uri,
                           surfaces_config=surfaces_config, seed=0, shuffle_buffer=4 * int(hp["batch_size"]),
                           max_len=getattr(model.cfg, "seq_len", None))
    max_steps = hp.get("max_steps")
    state = load_state(Path(checkpoint), model, [opt]) if checkpoint is not None and Path(checkpoint).is_file() else None
    losses: list[float] = state["losses"].tolist() if state else []
    step, missing = (int(state["step"]), int(state["missing"])) if state else (0, 0)
    first_epoch, done_batches = (int(state["epoch"]), int(state["batch"])) if state else (0, 0)
    t0 = time.perf_counter()
    for epoch in range(first_epoch, int(hp["epochs"])):
        stream.set_epoch(epoch)  # the same order as before the checkpoint: its batches are skipped
        for i, batch in enumerate(stream):
            if epoch == first_epoch and i < done_batches:
                continue
            if max_steps is not None and step >= int(max_steps):  # resumed from the last step's checkpoint
                break
            batch = batch.to(device)
            target = teacher_targets(tp, batch.request_ids).to(device)
            missing += int(torch.isnan(target[:, 0]).sum())
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                logits = model(batch)
            loss, parts = distill_loss(model, logits, batch, target, float(hp["kd_weight"]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            losses.append(float(loss.detach()))
            if log is not None and step % 10 == 0:
                log({"domain/loss": losses[-1], **{f"domain/loss_{k}": v for k, v in parts.items()}}, step=step)
            step += 1
            if checkpoint is not None and step % int(hp["checkpoint_every"]) == 0:
                save_state(Path(checkpoint), model, [opt], step=step, epoch=epoch, batch=i + 1, missing=missing,
                           losses=torch.tensor(losses, dtype=torch.float64))
            fail_if_asked(hp, step, "domain")
            if max_steps is not None and step >= int(max_steps):
                break
        if max_steps is not None and step >= int(max_steps):
            break
    model.eval()
    # metrics.predict / predict_teacher apply it from here on
    model.calibrator = fit_domain_calibrator(model, dates[1] + dt.timedelta(days=1), names, uri=uri,
                                             surfaces_config=surfaces_config, batch_size=int(hp["batch_size"]),
                                             device=device)
    info = {"domain": domain, "teacher": domain_teacher(domain), "surfaces": names,
            "dates": [dates[0].isoformat(), dates[1].isoformat()], "steps": step, "losses": losses,
            "rows_without_teacher": missing, "train_seconds": time.perf_counter() - t0, "hyperparameters": hp,
            "calibration": model.calibrator.metadata(), "ids_folded_in": folded,
            "resumed_from_step": int(state["step"]) if state else None}
    if fold_in:  # served like the foundation, from its own window (gem_model.distill.serving_fold_in)
        info["data"] = {"train": info["dates"]}
        info["train"] = {"item_svd": ((fold_in.get("train") or {}).get("item_svd") or {})}
    return model, info


def fit_domain_calibrator(model: torch.nn.Module, day: dt.date, surfaces: list[str], *, uri: str | None = None,
                          surfaces_config: SurfacesConfig | None = None, batch_size: int = 2048,
                          device: torch.device | str | None = None) -> Calibrator:
    """The domain model's own Platt maps, from its raw predictions of `day` on `surfaces` (module doc)."""
    def predict_day(d: str) -> pl.DataFrame:  # with a calibrator attached, fitting reads its p_*_raw columns
        stream = ExampleStream(d, d, surfaces, batch_size=batch_size, uri=uri, surfaces_config=surfaces_config,
                               shuffle=False, max_len=getattr(model.cfg, "seq_len", None))
        return predict(model, stream, device=device)

    return fit_model_calibrator(predict_day, [day.isoformat()], list(model.cfg.surfaces),
                                min_positives=DEFAULT_CALIBRATION["min_positives"])


def save_domain_model(
    model: torch.nn.Module, info: dict[str, Any], *, version: str | None = None, root: str | Path | None = None
) -> Path:
    """Save in gem_model.train.loop's model.pt layout ({"model", "model_config", "config", "step",
    "rows", "calibration" when the model has its calibrator}; weights_only-safe) + metrics.json under
    <root or $GEM_HOME/models/domain_models>/<domain>/<version>/.
    Returns the model.pt path (what registry.load_model / run_distillation(teachers=...) take)."""
    domain = info["domain"]
    version = version or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    d = (Path(root) / domain if root is not None else models_dir("domain_models", domain)) / version
    meta = {k: v for k, v in info.items() if k != "losses"}
    cal = getattr(model, "calibrator", None)
    atomic.torch_save({"model": model.state_dict(), "model_config": model.cfg.to_dict(), "config": meta,
                       "step": int(info.get("steps", 0)), "rows": json.dumps(info.get("rows", [])),
                       **({"calibration": cal.state()} if cal is not None else {})}, d / MODEL)
    atomic.write_json(d / "metrics.json", {**meta, "loss_curve": info.get("losses", []), "version": version})
    atomic.write_json(d / "config.json", meta)
    return d / MODEL
