"""Serving-time fold-in: a teacher scores a day with the ids born since its training window placed in
its item basis first, and its click map corrected per fold status.

Why: with churn most of E's ads are born after the teacher's window (it ends at E-3); their item rows
and topic vectors stay empty until the next retrain. Before scoring day D the ids first met between
the window and D get a direction from the aligned PPMI-SVD refit the warm retrain uses
(gem_model.train.item_svd.fold_in_item_svd) over those days' unlabelled logs, nothing of D itself.
The model then rates these kinds of ad differently: `known` (first seen in or before its window),
`folded` (first seen after it, before D), `folded_today` (first seen on D, in an earlier slice) and
`unseen` (no exposure logged before the slice of D it is scored in: nothing to fold); one monotone map
per surface cannot serve them all, so after it a Platt map per status (slope and shift on the mapped logit),
fitted on the map's own days (each scored as it was served), brings each status to its click rate. A
slope, not only a shift: behind the surface's map the folded ads' predictions of a teacher cold on a short window
spread too little around their level (bench/RESULTS.md, "serving-time fold-in"; bench/MODEL_SEARCH.md 35).
The status maps are pooled over the surfaces, so they move each surface's level off its map;
`train.item_svd.relevel_surfaces` then shifts each surface back to its click rate on the same rows.

Slices (`train.item_svd.serve_slices`, K): a day is served in K equal slices of its hours, and slice k
folds in, besides the days between, the day's own exposures of the hours before it (rows, never labels):
an ad born on D gets its direction from the audience it was shown to earlier that day, as a serving
system that refreshes its features during the day would. K = 1: nothing of D itself.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.data.loader import ExampleStream, date_range
from gem_model.models.calibration import fit_platt, fit_shift, logit
from gem_model.store.paths import storage_options, table_uri
from gem_model.train.item_svd import MAX_ROWS, Bags, Cooc, fold_in_item_svd

FOLD_STATUS = ("known", "folded", "unseen", "folded_today")  # folded_today: from the day's earlier slices
STATUS_MIN_POSITIVES = 30  # a status with fewer clicks on the fitting days keeps the map as it is
HOUR = "hour_of_day"


def _item_svd(config: dict[str, Any] | None) -> dict[str, Any]:
    return ((config or {}).get("train") or {}).get("item_svd") or {}


def _window_end(model: torch.nn.Module, config: dict[str, Any] | None) -> dt.date | None:
    """The last day of the model's window where it folds at all (see `serving_fold_in`), else None."""
    window = ((config or {}).get("data") or {}).get("train")
    cfg = getattr(model, "cfg", None)
    # no frozen buffer: no known rows to align on
    if not window or not _item_svd(config).get("serve_fold_in", True) or cfg is None or not cfg.n_topic_stats:
        return None
    return dt.date.fromisoformat(str(window[-1]))


def fold_window(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date) -> tuple[dt.date, dt.date] | None:
    """The whole days whose logs `serving_fold_in` reads to score `day`: from the day after the model's
    window to the day before `day`; None where there are none, or nothing is folded (see there)."""
    end = _window_end(model, config)
    if end is None:
        return None
    first, last = end + dt.timedelta(days=1), day - dt.timedelta(days=1)
    if (lookback := _item_svd(config).get("fold_lookback_days")) is not None:
        first = min(first, day - dt.timedelta(days=int(lookback)))
    return (first, last) if first <= last else None


def fold_days(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date) -> int:
    """How many whole days the fold for `day` reads."""
    window = fold_window(model, config, day)
    return (window[1] - window[0]).days + 1 if window else 0


def fits_like_served(config: dict[str, Any] | None) -> bool:
    """`train.item_svd.fit_fold_like_served` of a model's config (see `fold_days`' use in predict_teacher)."""
    return bool(_item_svd(config).get("fit_fold_like_served", False))


def folds(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date) -> bool:
    """Whether serving `day` folds anything in: days between the window and it, or slices of it."""
    return fold_window(model, config, day) is not None or len(serve_slices(model, config)) > 1


def serve_slices(model: torch.nn.Module, config: dict[str, Any] | None) -> list[tuple[int, int]]:
    """The [first, last) hours of each slice a day is served in (`train.item_svd.serve_slices`; one slice,
    the whole day, where nothing is folded)."""
    k = _slices(config) if _window_end(model, config) else 1
    return [(i * 24 // k, (i + 1) * 24 // k) for i in range(k)]


def _slices(config: dict[str, Any] | None) -> int:
    k = int(_item_svd(config).get("serve_slices", 1))
    if k < 1 or 24 % k:
        raise ValueError(f"train.item_svd.serve_slices must divide 24 (1, 2, 3, 4, 6, 8, 12 or 24), not {k}")
    return k


def with_serving(config: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A train config as if its model had been trained with these `train.item_svd` serving options (serve_slices,
    status_map): benches compare them on one model."""
    return {**config, "train": {**config["train"], "item_svd": {**config["train"]["item_svd"], **options}}}


def slice_filter(hours: tuple[int, int]) -> pl.Expr | None:
    """The rows of a day's slice (None: the whole day)."""
    return None if hours == (0, 24) else pl.col(HOUR).is_between(hours[0], hours[1] - 1)


@contextlib.contextmanager
def serving_fold_in(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date, *, uri: str | None = None,
                    batch_size: int = 4096, before_hour: int = 0,
                    cache: dict[tuple[dt.date, int], Cooc] | None = None) -> Iterator[dict[str, int] | None]:
    """Within the block, `model` scores `day` (from `before_hour` on) with the ids first met after its
    training window given a co-occurrence direction (gem_model.train.item_svd.fold_in_item_svd) from the
    logs of the days between its window and `day`, and of `day`'s hours before `before_hour`: item rows,
    never labels. On exit the model is as it was. config: its train config (`data.train` is the window;
    `train.item_svd`); None, no window, no topic buffer, `train.item_svd.serve_fold_in` false, or no log
    between the window and the hour: nothing folded, yields None. Else yields fold_in_item_svd's counts.
    cache: the co-occurrence counts (item_svd.Cooc) of each (day, hours before) counted so far, for this
    model: predict_teacher's calls of one pass share one, so a day's slices and its fitting days count
    each hour's rows once (a slice adds the hours since the previous one to that one's counts)."""
    end = _window_end(model, config)
    window = fold_window(model, config, day)
    if end is None or (window is None and before_hour <= 0):
        yield None
        return
    cfg = model.cfg
    saved = [(t, t.detach().clone()) for t in _folded_tensors(model)]
    max_rows = int(_item_svd(config).get("max_rows", MAX_ROWS))
    cache = {} if cache is None else cache

    def hours_of(d: dt.date, first: int, last: int) -> Cooc:
        where = slice_filter((first, last))
        return Cooc.of(Bags.read(model, ExampleStream(d, d, list(cfg.surfaces), batch_size=batch_size, uri=uri,
                                                      shuffle=False, drop_last=False, max_len=cfg.seq_len,
                                                      where=where)), max_rows)

    def before(d: dt.date, hours: int) -> Cooc:
        """The counts of `d`'s rows before `hours`: the longest counted stretch of it that ends no later,
        plus the hours since."""
        if (d, hours) not in cache:
            done = max((h for e, h in cache if e == d and h < hours), default=0)
            parts = [cache[d, done]] if done else []
            cache[d, hours] = Cooc.sum([*parts, hours_of(d, done, hours)])
            if 0 < done < 24:
                del cache[d, done]  # a day's earlier stretch is not read again: slices come in order
        return cache[d, hours]

    days = date_range(*window) if window else []
    parts = [(d, 24) for d in days] + ([(day, before_hour)] if before_hour > 0 else [])
    try:
        # svd_lowrank draws random probes: a fixed seed scores a day again to the same predictions
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            stats = fold_in_item_svd(model, Cooc.sum(before(*p) for p in parts), cfg.topic_dim, max_rows)
        yield stats
    finally:
        with torch.no_grad():
            for t, before_fold in saved:
                t.copy_(before_fold)


def fold_through(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date, *, uri: str | None = None,
                 batch_size: int = 4096) -> dict[str, int] | None:
    """`serving_fold_in` up to `day` (exclusive) kept: for a model trained further on the days after its window
    (a domain model), whose ids born since should not start the training without their direction. Returns the
    fold's counts (None: nothing folded)."""
    with serving_fold_in(model, config, day, uri=uri, batch_size=batch_size) as stats:
        folded = None if stats is None else [t.detach().clone() for t in _folded_tensors(model)]
    if folded is not None:
        with torch.no_grad():
            for t, value in zip(_folded_tensors(model), folded, strict=True):
                t.copy_(value)
    return stats


def _folded_tensors(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The item table and topic buffer a fold writes."""
    cfg = model.cfg
    return model.tables[cfg.sparse_features[cfg.target_pairs[0][0]][1]].weight, model.item_topic


def fold_status(config: dict[str, Any], days: list[dt.date], uri: str | None = None) -> pl.DataFrame:
    """request_id, fold_status of the impressions of `days` in `training_examples` (uri), one scan: the
    ad's first logged hour against the model's window (`config["data"]["train"]`) and the start of the
    slice its row is served in (`serve_slices`): unseen when nothing of the ad was logged before it."""
    end = dt.date.fromisoformat(str(config["data"]["train"][-1]))
    k = _slices(config)
    uri = uri or table_uri("training_examples")
    hour_key = pl.col("date").cast(pl.Int64) * 24 + pl.col(HOUR)  # hours since the epoch, in the logs' days
    lf = pl.scan_delta(uri, storage_options=storage_options(uri)).filter(pl.col("date") <= max(days))
    first = lf.group_by("ad_id").agg(hour_key.min().alias("first_hour"), pl.col("date").min().alias("first_seen"))
    slice_start = (pl.col(HOUR).cast(pl.Int64) * k) // 24 * (24 // k)  # the first hour of the row's slice
    rows = lf.filter(pl.col("date").is_in(days)).select(
        "request_id", "ad_id", "date", (pl.col("date").cast(pl.Int64) * 24 + slice_start).alias("served_from"))
    status = (pl.when(pl.col("first_hour") >= pl.col("served_from")).then(pl.lit(FOLD_STATUS[2]))
              .when(pl.col("first_seen") >= pl.col("date")).then(pl.lit(FOLD_STATUS[3]))
              .when(pl.col("first_seen") > end).then(pl.lit(FOLD_STATUS[1]))
              .otherwise(pl.lit(FOLD_STATUS[0])))
    return rows.join(first, on="ad_id", how="left").select("request_id", status.alias("fold_status")).collect()


def status_kind(config: dict[str, Any] | None) -> str:
    """`train.item_svd.status_map` of a model's config: platt (slope and shift) or shift (the slope kept)."""
    return str(_item_svd(config).get("status_map", "platt"))


def relevels_surfaces(config: dict[str, Any] | None) -> bool:
    """`train.item_svd.relevel_surfaces` of a model's config (see the module doc)."""
    return bool(_item_svd(config).get("relevel_surfaces", True))

def status_maps(rows: pl.DataFrame, kind: str = "platt", by: str = "fold_status") -> dict[str, tuple[float, float]]:
    """Per value of `by` (a fold status, or a surface), the map (a, b) on the logit, sigmoid(a * z + b), that
    minimises the log loss of `rows`' p_click (gem_model.models.calibration.fit_platt; kind shift: a = 1,
    fit_shift); rows: click, p_click (mapped), `by`, the fitting days' labelled impressions as served. No entry
    for a value with fewer than STATUS_MIN_POSITIVES clicks."""
    if kind not in ("platt", "shift"):
        raise ValueError(f"train.item_svd.status_map must be platt or shift, not {kind!r}")
    out = {}
    for (status,), g in rows.group_by(by):
        y = g["click"].cast(pl.Float64).to_numpy()
        if y.sum() >= STATUS_MIN_POSITIVES:
            z = logit(g["p_click"].cast(pl.Float64).to_numpy())
            out[str(status)] = fit_platt(z, y) if kind == "platt" else (1.0, fit_shift(z, y))
    return out


def with_status_maps(df: pl.DataFrame, status: pl.DataFrame, maps: dict[str, tuple[float, float]],
                     by: str = "fold_status") -> pl.DataFrame:
    """`df` (request_id, p_click, ...) with p_click through the map of its row's `by` in `status` (request_id,
    `by`; none: kept)."""
    if not maps:
        return df
    a = {k: float(v[0]) for k, v in maps.items()}
    b = {k: float(v[1]) for k, v in maps.items()}
    ab = status.select("request_id",
                       pl.col(by).replace_strict(a, default=1.0, return_dtype=pl.Float64).alias("_a"),
                       pl.col(by).replace_strict(b, default=0.0, return_dtype=pl.Float64).alias("_b"))
    out = df.join(ab, on="request_id", how="left", maintain_order="left").with_columns(
        pl.col("_a").fill_null(1.0), pl.col("_b").fill_null(0.0))
    z = out["_a"].to_numpy() * logit(out["p_click"].cast(pl.Float64).to_numpy()) + out["_b"].to_numpy()
    return out.with_columns(pl.Series("p_click", 1 / (1 + np.exp(-z)), dtype=df.schema["p_click"])).select(df.columns)
