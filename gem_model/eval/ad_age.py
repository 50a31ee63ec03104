"""E's NE split by the ad's age, the age read from the logs alone.

An ad's age on day E is E minus the first date its ad_id appears in `events` (on any surface), never
the simulator's hidden birth date, so the split means the same on real logs. Three buckets:
`new` (first seen on E: the model never saw it), `recent` (first seen on E-1 or E-2: at most the
validation and the students' last day) and `older`. Ads seen before the lake's first day count from
that day.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import polars as pl

from gem_model.eval.metrics import normalized_entropy
from gem_model.store.paths import storage_options, table_uri

AGE_BUCKETS = ("new", "recent", "older")
RECENT_DAYS = 2  # `recent`: first seen 1..RECENT_DAYS days before E
ALL = "all"  # the row pooling every surface
EVAL_PREDICTIONS = "eval_predictions.parquet"  # what gem_model.train.loop saves of E in a version dir


def ad_ages(events: pl.LazyFrame | pl.DataFrame, day: dt.date) -> pl.DataFrame:
    """request_id, ad_age of every impression of `day` in `events` (columns request_id, date, ad_id),
    the first-seen date taken over the days of `events` up to `day`."""
    lf = events.lazy().filter(pl.col("date") <= day)
    first = lf.group_by("ad_id").agg(pl.col("date").min().alias("first_seen"))
    days = (pl.lit(day) - pl.col("first_seen")).dt.total_days()
    age = (
        pl.when(days == 0).then(pl.lit(AGE_BUCKETS[0]))
        .when(days <= RECENT_DAYS).then(pl.lit(AGE_BUCKETS[1]))
        .otherwise(pl.lit(AGE_BUCKETS[2]))
    )  # fmt: skip
    return (
        lf.filter(pl.col("date") == day)
        .select("request_id", "ad_id")
        .join(first, on="ad_id", how="left")
        .select("request_id", age.alias("ad_age"))
        .collect()
    )


def ne_by_age(rows: pl.DataFrame, ages: pl.DataFrame, label: str = "click", score: str = "p_click"
              ) -> list[dict[str, Any]]:  # fmt: skip
    """NE of `score` on `label` per (surface, ad_age), and pooled over surfaces (surface `all`);
    rows: request_id, surface, label, score. A bucket without both classes has NE nan."""
    df = rows.join(ages, on="request_id", how="inner")
    out = []
    for surface in [*sorted(df["surface"].unique().to_list()), ALL]:
        sub = df if surface == ALL else df.filter(pl.col("surface") == surface)
        for bucket in AGE_BUCKETS:
            b = sub.filter(pl.col("ad_age") == bucket)
            y, p = b[label].cast(pl.Float64).to_numpy(), b[score].cast(pl.Float64).to_numpy()
            out.append({"surface": surface, "ad_age": bucket, "n": b.height, "positives": int(y.sum()),
                        "ne": normalized_entropy(y, p) if b.height else float("nan")})  # fmt: skip
    return out


def read_events(day: dt.date, uri: str | None = None) -> pl.LazyFrame:
    """The lake's `events` up to `day` (request_id, date, ad_id)."""
    uri = uri or table_uri("events")
    return (
        pl.scan_delta(uri, storage_options=storage_options(uri))
        .filter(pl.col("date") <= day)
        .select("request_id", "date", "ad_id")
    )


def eval_ne_by_age(predictions: str | Path, day: dt.date, events_uri: str | None = None) -> list[dict[str, Any]]:
    """E's click NE by ad age for a version's eval predictions (request_id, surface, click, p_click)."""
    return ne_by_age(pl.read_parquet(predictions), ad_ages(read_events(day, events_uri), day))


def version_report(version_dir: str | Path, day: dt.date, lake: str | None = None) -> dict[str, Any]:
    """{"ne_by_ad_age": rows} for a model version's predictions on E, {} when it saved none or the lake
    has no `events` table to date the ads by (a lake of training examples alone): the foundation asset's
    hook into its evaluation report."""
    from deltalake import DeltaTable

    path = Path(version_dir) / EVAL_PREDICTIONS
    events = table_uri("events", lake)
    if not path.is_file() or not DeltaTable.is_deltatable(events, storage_options=storage_options(events)):
        return {}
    return {"ne_by_ad_age": eval_ne_by_age(path, day, events)}
