"""Serving-time fold-in: a teacher scores a day with the ids born since its training window placed in
its item basis first, and its click map corrected per fold status.

Why: with churn most of E's ads are born after the teacher's window (it ends at E-3); their item rows
and topic vectors stay empty until the next retrain. Before scoring day D the ids first met between
the window and D get a direction from the aligned PPMI-SVD refit the warm retrain uses
(gem_model.train.item_svd.fold_in_item_svd) over those days' unlabelled logs, nothing of D itself.
The model then rates three kinds of ad differently: `known` (first seen in or before its window),
`folded` and `unseen` (first seen on D: nothing to fold); one monotone map per surface cannot serve
all three, so after it a logit shift per status, fitted on the map's own days (each scored as it was
served), brings each status's mean to its click rate (bench/RESULTS.md, "serving-time fold-in").
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.data.loader import ExampleStream
from gem_model.eval.ad_age import first_seen
from gem_model.models.calibration import fit_shift, logit
from gem_model.store.paths import storage_options, table_uri
from gem_model.train.item_svd import MAX_ROWS, fold_in_item_svd

FOLD_STATUS = ("known", "folded", "unseen")
SHIFT_MIN_POSITIVES = 30  # a status with fewer clicks on the fitting days keeps the map as it is


def _item_svd(config: dict[str, Any] | None) -> dict[str, Any]:
    return ((config or {}).get("train") or {}).get("item_svd") or {}


def fold_window(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date) -> tuple[dt.date, dt.date] | None:
    """The days whose logs `serving_fold_in` reads to score `day`: from the day after the model's window
    to the day before `day`; None where nothing is folded (see there)."""
    window = ((config or {}).get("data") or {}).get("train")
    svd = _item_svd(config)
    cfg = getattr(model, "cfg", None)
    # no frozen buffer: no known rows to align on
    if not window or not svd.get("serve_fold_in", True) or cfg is None or not cfg.n_topic_stats:
        return None
    first, last = dt.date.fromisoformat(str(window[-1])) + dt.timedelta(days=1), day - dt.timedelta(days=1)
    return (first, last) if first <= last else None


@contextlib.contextmanager
def serving_fold_in(model: torch.nn.Module, config: dict[str, Any] | None, day: dt.date, *, uri: str | None = None,
                    batch_size: int = 4096) -> Iterator[dict[str, int] | None]:
    """Within the block, `model` scores `day` with the ids first met after its training window given a
    co-occurrence direction (gem_model.train.item_svd.fold_in_item_svd) from the logs of the days between
    its window and `day`: item rows, never labels, nothing of `day` itself. On exit the model is as it was.
    config: its train config (`data.train` is the window; `train.item_svd`); None, no window, no topic
    buffer, `train.item_svd.serve_fold_in` false or `day` next to the window: nothing folded, yields None.
    Else yields fold_in_item_svd's counts."""
    window = fold_window(model, config, day)
    if window is None:
        yield None
        return
    cfg = model.cfg
    first, last = window
    table = model.tables[cfg.sparse_features[cfg.target_pairs[0][0]][1]].weight
    saved = [(t, t.detach().clone()) for t in (table, model.item_topic)]
    stream = ExampleStream(first, last, list(cfg.surfaces), batch_size=batch_size, uri=uri, shuffle=False,
                           drop_last=False, max_len=cfg.seq_len)
    try:
        # svd_lowrank draws random probes: a fixed seed scores a day again to the same predictions
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            stats = fold_in_item_svd(model, stream, cfg.topic_dim, int(_item_svd(config).get("max_rows", MAX_ROWS)))
        yield stats
    finally:
        with torch.no_grad():
            for t, before in saved:
                t.copy_(before)


def fold_status(config: dict[str, Any], days: list[dt.date], uri: str | None = None) -> pl.DataFrame:
    """request_id, fold_status of the impressions of `days` in `training_examples` (uri), one scan: the
    ad's first date in the logs against the model's window (`config["data"]["train"]`) and its row's day."""
    end = dt.date.fromisoformat(str(config["data"]["train"][-1]))
    uri = uri or table_uri("training_examples")
    events = pl.scan_delta(uri, storage_options=storage_options(uri)).select("request_id", "date", "ad_id")
    status = (pl.when(pl.col("first_seen") >= pl.col("date")).then(pl.lit(FOLD_STATUS[2]))
              .when(pl.col("first_seen") > end).then(pl.lit(FOLD_STATUS[1]))
              .otherwise(pl.lit(FOLD_STATUS[0])))
    return first_seen(events, days).select("request_id", status.alias("fold_status")).collect()


def status_shifts(rows: pl.DataFrame) -> dict[str, float]:
    """Per fold status, the logit shift that brings the mean of `rows`' p_click to their click rate
    (gem_model.models.calibration.fit_shift); rows: click, p_click (mapped), fold_status, the fitting
    days' labelled impressions as served. No entry for a status with fewer than SHIFT_MIN_POSITIVES clicks."""
    out = {}
    for (status,), g in rows.group_by("fold_status"):
        y = g["click"].cast(pl.Float64).to_numpy()
        if y.sum() >= SHIFT_MIN_POSITIVES:
            out[str(status)] = fit_shift(logit(g["p_click"].cast(pl.Float64).to_numpy()), y)
    return out


def with_shifts(df: pl.DataFrame, status: pl.DataFrame, shifts: dict[str, float]) -> pl.DataFrame:
    """`df` (request_id, p_click, ...) with p_click moved by its row's status shift (none: kept)."""
    if not shifts:
        return df
    shift = status.select("request_id", pl.col("fold_status").replace_strict(shifts, default=0.0,
                                                                              return_dtype=pl.Float64).alias("_d"))
    out = df.join(shift, on="request_id", how="left", maintain_order="left").with_columns(pl.col("_d").fill_null(0.0))
    z = logit(out["p_click"].cast(pl.Float64).to_numpy()) + out["_d"].to_numpy()
    return out.with_columns(pl.Series("p_click", 1 / (1 + np.exp(-z)), dtype=df.schema["p_click"])).select(df.columns)
