"""A small synthetic `training_examples` (+ `oracle`) lake with a learnable signal, for tests and benches.

Users have two favourite topics; items (ads and organic) belong to topic `item_id % n_topics`. A
user's history is mostly items from their topics. The click probability rises when the candidate
ad's topic is one of the user's topics and again when the ad itself appears in the history (so a
model that reads the jagged history beats one that does not), with an ad-quality effect and a
position effect that a few hundred steps can learn. Not the production simulator.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from gem_model.config import SurfacesConfig, load_surfaces
from gem_model.store.paths import storage_options
from gem_model.store.schemas import (
    ACTIONS,
    COUNTER_COLUMNS,
    CREATIVE_FORMATS,
    DEVICES,
    OBJECTIVES,
    ORACLE_SCHEMA,
    TODAY_COUNTER_COLUMNS,
    TRAINING_EXAMPLES_SCHEMA,
)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def synthetic_day(
    date: dt.date,
    rows: int,
    *,
    surfaces: SurfacesConfig | None = None,
    seed: int = 0,
    n_users: int = 2000,
    n_ads: int = 500,
    n_items: int = 4000,
    n_topics: int = 16,
    max_hist: int = 48,
    history_only: bool = False,
    empty_history: bool = False,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One day of (training_examples, oracle) rows with exactly the lake schemas.

    history_only: the click depends on the user's history alone (the candidate's topic among the
    user's topics, which only the history reveals, and the ad's presence in it); empty_history: the
    same rows and labels with every history emptied (the control of a model that reads histories)."""
    surfaces = surfaces or load_surfaces()
    world = np.random.default_rng(seed)  # the same users every day
    interests = np.stack([world.permutation(n_topics)[:2] for _ in range(n_users)])
    tenure = world.gamma(2.0, 200.0, n_users)
    ad_quality = world.normal(0.0, 0.6, n_ads + 1)
    rng = np.random.default_rng([seed, date.toordinal()])

    names = surfaces.names
    share = np.array([s.traffic_share for s in surfaces.surfaces])
    s_idx = rng.choice(len(names), size=rows, p=share / share.sum())
    user = rng.integers(0, n_users, rows)
    ad = rng.integers(1, n_ads + 1, rows)
    ad_topic = ad % n_topics
    fav = (interests[user] == ad_topic[:, None]).any(1)

    # Jagged histories: mostly items from the user's topics, oldest first.
    lengths = rng.integers(0, max_hist + 1, rows)
    lengths[rng.random(rows) < 0.1] = 0
    total = int(lengths.sum())
    row_of = np.repeat(np.arange(rows), lengths)
    topic = np.where(
        rng.random(total) < 0.8, interests[user[row_of], rng.integers(0, 2, total)], rng.integers(0, n_topics, total)
    )
    item = topic + n_topics * rng.integers(0, n_items // n_topics, total)
    item = np.where(item == 0, n_topics, item)
    is_ad = rng.random(total) < 0.3  # some history entries are ads of the user's topics
    item = np.where(is_ad, (topic + n_topics * rng.integers(0, n_ads // n_topics, total)).clip(1, n_ads), item)
    action = np.asarray(ACTIONS)[rng.integers(0, len(ACTIONS), total)]
    h_surface = np.asarray(names)[rng.integers(0, len(names), total)]
    secs = np.sort(rng.exponential(86400.0, total))[::-1] + 1.0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    in_hist = np.bincount(row_of[item == ad[row_of]], minlength=rows) > 0

    s_off = np.array([-0.2, 0.1, -0.4, 0.3, 0.0, 0.2, -0.1, 0.05] * 4)[: len(names)]
    position = rng.integers(1, 10, rows)
    logit = (
        -3.0 + 1.8 * fav + 1.5 * in_hist + s_off[s_idx] + ad_quality[ad] - 0.12 * (position - 1)
        + 0.15 * rng.standard_normal(rows)
    )
    if history_only:
        logit = -3.2 + 2.6 * fav + 1.5 * in_hist
    p_click = _sigmoid(logit)
    click = rng.random(rows) < p_click
    q_conv = _sigmoid(-1.5 + 0.8 * fav)
    p_conv = p_click * q_conv
    has_conv = np.array(["conversion" in s.tasks for s in surfaces.surfaces])[s_idx]
    conversion = click & (rng.random(rows) < q_conv)

    midnight = dt.datetime.combine(date, dt.time(), tzinfo=dt.UTC)
    sec = rng.integers(0, 86400, rows)
    ts = np.datetime64(midnight.replace(tzinfo=None), "us") + sec.astype("timedelta64[s]")
    rid = [f"{date:%Y%m%d}-{i:07d}" for i in range(rows)]
    s_name = np.asarray(names)[s_idx]

    if empty_history:
        offsets = np.zeros_like(offsets)
        item, action, h_surface, secs = item[:0], action[:0], h_surface[:0], secs[:0]

    def lst(values: np.ndarray, typ: pa.DataType) -> pl.Series:
        return pl.Series(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=typ)))

    df = pl.DataFrame(
        {
            "request_id": rid,
            "ts": pl.Series(ts).dt.replace_time_zone("UTC"),
            "date": [date] * rows,
            "surface": s_name,
            "domain": [surfaces.get(n).domain for n in s_name],
            "user_id": user.astype(np.int64) + 1,
            "ad_id": ad.astype(np.int64),
            "advertiser_id": (ad // 5 + 1).astype(np.int64),
            "objective": np.asarray(OBJECTIVES)[ad % len(OBJECTIVES)],
            "creative_format": np.asarray(CREATIVE_FORMATS)[(ad // 3) % len(CREATIVE_FORMATS)],
            "device": np.asarray(DEVICES)[user % len(DEVICES)],
            "position": position.astype(np.int32),
            "bid": rng.gamma(2.0, 0.5, rows),
            "user_tenure_days": tenure[user],
            "hour_of_day": (sec // 3600).astype(np.int32),
            "click": click.astype(np.int8),
            "click_ts": pl.Series(np.where(click, ts + np.timedelta64(30, "s"), np.datetime64("NaT"))),
            "conversion": pl.Series(conversion.astype(np.int8)),
            "conversion_ts": pl.Series(np.where(conversion, ts + np.timedelta64(600, "s"), np.datetime64("NaT"))),
            "hist_item_id": lst(item.astype(np.int64), pa.int64()),
            "hist_action": lst(action, pa.string()),
            "hist_surface": lst(h_surface, pa.string()),
            "hist_seconds_before": lst(secs.astype(np.float64), pa.float64()),
        }
    )
    df = df.with_columns(
        pl.when(pl.Series(has_conv)).then(pl.col("conversion")).otherwise(None).alias("conversion"),
        pl.col("click_ts", "conversion_ts").dt.replace_time_zone("UTC"),
        # a history-only world: no counters (its features list none; the columns keep the contract)
        *[pl.lit(0.0).alias(c) for c in (*COUNTER_COLUMNS, *TODAY_COUNTER_COLUMNS)],
    ).cast(TRAINING_EXAMPLES_SCHEMA).select(list(TRAINING_EXAMPLES_SCHEMA))
    oracle = pl.DataFrame(
        {
            "request_id": rid,
            "date": [date] * rows,
            "surface": s_name,
            "p_click": p_click,
            "p_conversion": np.where(has_conv, p_conv, np.nan),
        }
    ).with_columns(pl.col("p_conversion").fill_nan(None)).cast(ORACLE_SCHEMA)
    return df, oracle


def write_synthetic_lake(
    lake_root: str,
    dates: Sequence[dt.date],
    rows_per_day: int,
    *,
    seed: int = 0,
    **kw: Any,
) -> None:
    """Write `training_examples` (by date) and `oracle` (by date, surface) under `lake_root` (a path or URI)."""
    so = storage_options(lake_root)
    for i, d in enumerate(dates):
        ex, orc = synthetic_day(d, rows_per_day, seed=seed, **kw)
        mode = "overwrite" if i == 0 else "append"
        ex.write_delta(f"{lake_root}/training_examples", mode=mode, storage_options=so,
                       delta_write_options={"partition_by": ["date"]})
        orc.write_delta(f"{lake_root}/oracle", mode=mode, storage_options=so,
                        delta_write_options={"partition_by": ["date", "surface"]})
