"""Teacher inference: one batched pass of a teacher over `training_examples` -> `teacher_predictions`.

`teacher_predictions` (Delta, partitioned by date, keyed by (request_id, teacher)) is what every
student reads: KD targets (p_click, p_conversion) and summary embeddings (representation transfer),
so all students of a teacher share one pass. teacher = "foundation" or "domain:<name>".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import torch

from gem_model.config import SurfacesConfig, load_surfaces, validate_name
from gem_model.data.loader import ExampleStream, date_range
from gem_model.distill.refit_cache import Refit, load_refit, refit_key, save_refit
from gem_model.distill.serving_fold_in import (
    fits_like_served,
    fold_days,
    fold_status,
    folds,
    relevels_surfaces,
    serve_slices,
    serving_fold_in,
    slice_filter,
    status_kind,
    status_maps,
    with_serving,
    with_status_maps,
)
from gem_model.eval.metrics import predict
from gem_model.models.calibration import refit, refit_days
from gem_model.store.delta import overwrite_partition
from gem_model.store.paths import storage_options as env_storage_options
from gem_model.store.paths import table_uri
from gem_model.train.precision import autocast_dtype

TABLE = "teacher_predictions"
FOUNDATION = "foundation"

TEACHER_PREDICTIONS_SCHEMA: dict[str, pl.DataType] = {
    "date": pl.Date(),
    "surface": pl.String(),
    "request_id": pl.String(),
    "teacher": pl.String(),
    "teacher_version": pl.String(),
    "p_click": pl.Float64(),
    "p_conversion": pl.Float64(),  # null where the surface logs no conversions
    "embedding": pl.List(pl.Float32()),  # the teacher's summary embedding
}


def domain_teacher(domain: str) -> str:
    return f"domain:{validate_name(domain, 'domain')}"


def path_applies(path: str, surface: str, surfaces: SurfacesConfig | None = None) -> bool:
    """The hierarchical path needs a domain of two or more surfaces (with one, the domain model is
    the foundation re-distilled on the student's own data: not a hierarchy)."""
    if path != "hierarchical":
        return True
    cfg = surfaces or load_surfaces()
    return len(cfg.in_domain(cfg.get(surface).domain)) >= 2


def teacher_for(path: str, surface: str, surfaces: SurfacesConfig | None = None) -> str | None:
    """The teacher a student on `surface` learns from on `path` (direct | hierarchical | none)."""
    if path == "none":
        return None
    if path == "direct":
        return FOUNDATION
    if path == "hierarchical":
        return domain_teacher((surfaces or load_surfaces()).get(surface).domain)
    raise ValueError(f"unknown path {path!r}: direct | hierarchical | none")


def _dates(dates: Sequence[dt.date | str] | tuple) -> list[dt.date]:
    if isinstance(dates, (dt.date, str)):
        dates = [dates]
    if isinstance(dates, tuple) and len(dates) == 2 and not isinstance(dates[0], (list, tuple)):
        if days := date_range(*dates):  # an inclusive (first, last) pair; first > last: two dates
            return days
    return [d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)) for d in dates]


def predict_teacher(
    model: torch.nn.Module,
    dates: Sequence[dt.date | str] | dt.date | str,
    teacher_name: str,
    teacher_version: str,
    *,
    surfaces: Sequence[str] | None = None,
    batch_size: int = 4096,
    uri: str | None = None,
    device: torch.device | str | None = None,
    precision: str = "auto",
    recalibrate: bool = False,
    fold_in: dict[str, Any] | None = None,
    refit_cache: Path | str | None = None,
) -> pl.DataFrame:
    """One batched, unshuffled pass of a GEM teacher (`forward_with_summary`) over every row of
    `training_examples` on `dates` (list, single date, or inclusive (first, last) pair) for
    `surfaces` (default: all). Returns a frame with TEACHER_PREDICTIONS_SCHEMA. The model is moved
    to `device` (default: where it is); precision: auto | bf16 | fp32 (autocast; heads stay fp32).
    recalibrate: a date after the map's fitting days is scored behind its map re-fitted on the days
    before it (gem_model.models.calibration.refit_days). fold_in: the model's train config (load_model's
    second value): each date is scored with the ids born since the model's window folded in first
    (`serving_fold_in`; in `train.item_svd.serve_slices` slices of the day, each with the day's earlier
    hours too), and its map is fitted anew on its fitting days (or the `refit_days`), each scored as it
    would have been served (`train.item_svd.fit_fold_like_served`: each folding in as many whole days as the
    date scored does); then each ad's click prediction goes through the map its fold status (known / folded /
    folded_today / unseen) needed on those days (gem_model.distill.serving_fold_in).
    refit_cache: the teacher's version dir: those refits are kept there and read back while the logs are unchanged
    (gem_model.distill.refit_cache); None: fitted in this call (once per set of fitting days)."""
    if teacher_name != FOUNDATION and not teacher_name.startswith("domain:"):
        raise ValueError(f"teacher must be 'foundation' or 'domain:<name>', not {teacher_name!r}")
    surfaces_config = load_surfaces()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    amp_dtype = autocast_dtype(precision, device)
    no_conversions = [s for s, ok in zip(model.cfg.surfaces, model.task_allowed[:, 1].tolist(), strict=True) if not ok]
    frames = []

    def stream(d: dt.date, where: pl.Expr | None = None) -> ExampleStream:
        return ExampleStream(d, d, surfaces, batch_size=batch_size, surfaces_config=surfaces_config, uri=uri,
                             shuffle=False, drop_last=False, chunk_rows=max(batch_size, 16384),
                             max_len=getattr(getattr(model, "cfg", None), "seq_len", None), where=where)

    def served(d: dt.date, with_embeddings: bool = False, config: dict[str, Any] | None = fold_in) -> pl.DataFrame:
        """`d` scored as served: slice by slice, each with what was logged before it folded in."""
        parts = []
        slices = serve_slices(model, config)
        for hours in slices:
            rows = stream(d, slice_filter(hours))
            if len(slices) > 1 and rows.count_rows() == 0:
                continue  # nothing to score (an untimed dataset's rows all sit at noon): no fold either
            with serving_fold_in(model, config, d, uri=uri, batch_size=batch_size, before_hour=hours[0], cache=bags):
                parts.append(predict(model, rows, device=device, amp_dtype=amp_dtype, with_embeddings=with_embeddings))
        return pl.concat(parts) if parts else predict(model, stream(d), device=device, amp_dtype=amp_dtype,
                                                      with_embeddings=with_embeddings)

    stored = getattr(model, "calibrator", None)
    bags: dict = {}  # the bags each fold reads, per (day, hours): the slices and fitting days overlap
    # (fitting days, per status, whole days each fitting day folds in: None, as served): days sharing one share it
    refits: dict[tuple[tuple[dt.date, ...], bool, int | None], Refit] = {}

    def refit_as_served(days: tuple[dt.date, ...], per_status: bool, fit_config: dict[str, Any] | None) -> Refit:
        """(the stored map re-fitted on `days` scored as served with `fit_config`, or None without rows; with
        per_status, the fold-status maps after it and the surfaces' levels after those). A fitting day's fold
        statuses are those of its own ads, whichever day is served."""
        fit_df = pl.concat([served(f, config=fit_config) for f in days])  # behind the stored map: the refit reads p_click_raw
        if not fit_df.height:
            return None, {}, {}
        calibrator, maps, levels = refit(stored, fit_df, list(days)), {}, {}
        if per_status:  # the fitting days through the new map, per fold status: what one map per surface leaves
            status = fold_status(fold_in, list(days), uri)
            rows = fit_df.filter(pl.col("click_mask")).join(status, on="request_id")
            mapped = calibrator.apply_probs(rows["p_click_raw"].to_numpy(), rows["surface"].to_numpy())
            rows = rows.with_columns(pl.Series("p_click", mapped))
            maps = status_maps(rows, status_kind(fold_in))
            if maps and relevels_surfaces(fold_in):  # the status maps are pooled: each surface to its rate
                levels = status_maps(with_status_maps(rows, status, maps), "shift", by="surface")
        return calibrator, maps, levels

    def kept_refit(days: tuple[dt.date, ...], per_status: bool, lookback: int | None) -> Refit:
        fit_config = with_serving(fold_in, fold_lookback_days=lookback) if lookback else fold_in
        if refit_cache is None:
            return refit_as_served(days, per_status, fit_config)
        name = refit_key(fit_config, days, per_status, surfaces, f"{device.type}:{amp_dtype}",
                         uri or table_uri("training_examples"))
        if (found := load_refit(Path(refit_cache), name)) is not None:
            return found
        result = refit_as_served(days, per_status, fit_config)
        save_refit(Path(refit_cache), name, result)
        return result

    for d in _dates(dates):
        # KD targets are the teacher's calibrated probabilities (predict applies its map): a per-surface
        # bias of the teacher would otherwise become the student's (the map is monotone: ranking unchanged).
        # Between retrains the world moves on: a day past the map's own is scored behind a map re-fitted
        # on the days just before it (`refit_days`: never a training day, never the day itself).
        days = refit_days(d, stored.fit_day) if recalibrate and stored is not None else None
        if stored is not None and stored.fit_day and not days and folds(model, fold_in, d):
            # the stored map was fitted on the model as it was, before any fold-in: fitted anew on its days
            days = [dt.date.fromisoformat(f) for f in stored.fit_day.split(",")]
        calibrator, maps, levels = None, {}, {}
        if days:
            per_status = fold_in is not None and folds(model, fold_in, d)
            # fit_fold_like_served: each fitting day folds in as many whole days before it as `d` does
            lookback = fold_days(model, fold_in, d) if per_status and fits_like_served(fold_in) else None
            key = (tuple(days), per_status, lookback or None)
            if key not in refits:
                refits[key] = kept_refit(*key)
            calibrator, maps, levels = refits[key]
        try:
            model.calibrator = calibrator if calibrator is not None else stored
            df = served(d, with_embeddings=True)
        finally:
            model.calibrator = stored
        if maps:
            status = fold_status(fold_in, [d], uri)
            df = with_status_maps(df, status, maps)
            df = with_status_maps(df, df.select("request_id", "surface"), levels, by="surface")
        conversion = pl.when(pl.col("surface").is_in(no_conversions)).then(None).otherwise(pl.col("p_conversion"))
        frames.append(df.select(pl.lit(d).alias("date"), "surface", "request_id", pl.lit(teacher_name).alias("teacher"),
                                pl.lit(str(teacher_version)).alias("teacher_version"), "p_click",
                                conversion.fill_nan(None).alias("p_conversion"), "embedding"))
    if not frames:
        return pl.DataFrame(schema=TEACHER_PREDICTIONS_SCHEMA)
    return pl.concat(frames).cast(TEACHER_PREDICTIONS_SCHEMA).select(list(TEACHER_PREDICTIONS_SCHEMA))


def write_teacher_predictions(df: pl.DataFrame, *, uri: str | None = None) -> int:
    """Replace exactly the (date, teacher) slices present in `df` (idempotent, one atomic commit;
    other teachers of the same date are kept). Returns the new Delta version."""
    uri = uri or table_uri(TABLE)
    df = df.cast(TEACHER_PREDICTIONS_SCHEMA).select(list(TEACHER_PREDICTIONS_SCHEMA))
    if df.height == 0:
        raise ValueError("no teacher predictions to write")
    keys = df.select("date", "teacher").unique().sort("date", "teacher").rows()
    pred = " OR ".join(f"(date = '{d.isoformat()}' AND teacher = '{t}')" for d, t in keys)
    # one writer per date partition (gem_model.store.delta); the version is this write's own commit
    dates = [f"date={d.isoformat()}" for d, _ in keys]
    return overwrite_partition(df, uri, partition_by=["date"], lock_keys=dates, predicate=pred,
                               storage_options=env_storage_options())


def read_teacher_predictions(
    dates: Sequence[dt.date | str] | None = None,
    teachers: Sequence[str] | None = None,
    *,
    uri: str | None = None,
    embeddings: bool = True,
) -> pl.DataFrame:
    """Rows of `teacher_predictions` for `dates` (default all) and `teachers` (default all)."""
    lf = pl.scan_delta(uri or table_uri(TABLE), storage_options=env_storage_options())
    if dates is not None:
        lf = lf.filter(pl.col("date").is_in(_dates(list(dates))))
    if teachers is not None:
        lf = lf.filter(pl.col("teacher").is_in(list(teachers)))
    if not embeddings:
        lf = lf.drop("embedding")
    return lf.collect()
