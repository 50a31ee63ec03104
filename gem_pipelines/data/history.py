"""Point-in-time join: each impression with its user's last N activities strictly before it.

The histories are built as Arrow list columns straight from offsets (values + offsets is exactly
the jagged layout the model consumes), with no per-row Python and no padding.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pyarrow as pa

from gem_model.config import FeaturesConfig
from gem_pipelines.data import lake
from gem_pipelines.data.counters import attach_counters
from gem_pipelines.data.formats import HISTORY_COLUMNS, events_schema, training_examples_schema

_TS_BITS = 42  # 2^42 us ~ 50 days: room for the lookback window, leaves 21 bits for user ids


def attach_history(events: pl.DataFrame, activity: pl.DataFrame, max_len: int) -> pl.DataFrame:
    """`events` (its columns kept) + hist_* list columns from `activity` (user_id, ts, item_id, action, surface)."""
    if events.height == 0:
        return events.with_columns(pl.lit([], dtype=t).alias(c) for c, t in HISTORY_COLUMNS.items())
    t0 = min(events["ts"].min(), activity["ts"].min() if activity.height else events["ts"].min())
    # Dense user index so the packed (user, time) key fits in int64 whatever the id values are.
    users = pl.concat([events["user_id"], activity["user_id"]]).unique().sort()
    uidx = pl.DataFrame({"user_id": users, "u": pl.Series(range(len(users)), dtype=pl.Int64)})
    if len(users) >= 1 << (63 - _TS_BITS):
        raise ValueError(f"too many users ({len(users)}) in one partition for the packed history key")

    def key(df: pl.DataFrame) -> pl.DataFrame:
        rel = (pl.col("ts") - pl.lit(t0)).dt.total_microseconds()
        return df.join(uidx, on="user_id", how="left").with_columns(
            key=pl.col("u") * (1 << _TS_BITS) + rel, rel=rel
        )

    act = key(activity).sort("key")
    if act["rel"].max() is not None and act["rel"].max() >= 1 << _TS_BITS:
        raise ValueError("history lookback window too long for the packed key")
    ev = key(events)
    act_key = act["key"].to_numpy()
    ev_key = ev["key"].to_numpy()
    ev_user_start = ev["u"].to_numpy() << _TS_BITS
    end = np.searchsorted(act_key, ev_key, side="left")  # strictly before the impression
    first_of_user = np.searchsorted(act_key, ev_user_start, side="left")
    start = np.maximum(first_of_user, end - max_len)
    lengths = (end - start).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    take = np.repeat(start - offsets[:-1], lengths) + np.arange(offsets[-1])
    act_ts = act["rel"].to_numpy()
    ev_ts = ev["rel"].to_numpy()
    seconds = (np.repeat(ev_ts, lengths) - act_ts[take]) / 1e6
    off = pa.array(offsets, type=pa.int32())

    def lst(values: np.ndarray | pa.Array) -> pl.Series:
        return pl.from_arrow(pa.ListArray.from_arrays(off, pa.array(values)))  # type: ignore[return-value]

    hist = {
        "hist_item_id": lst(act["item_id"].to_numpy()[take]),
        "hist_action": lst(act["action"].to_arrow().take(pa.array(take))),
        "hist_surface": lst(act["surface"].to_arrow().take(pa.array(take))),
        "hist_seconds_before": lst(seconds.astype(np.float64)),
    }
    return ev.select(events.columns).with_columns(**hist).cast(HISTORY_COLUMNS)  # type: ignore[arg-type]


def build_training_examples(date: dt.date, features: FeaturesConfig, *, root: str | None = None) -> pl.DataFrame:
    """All surfaces' events of `date` joined with cross-surface activity of the lookback window, and
    with the counters of the window's earlier days (data/counters.py)."""
    history = features.history
    schema = training_examples_schema(features.context)
    events = lake.read_partition("events", date, root=root).select(list(events_schema(features.context)))
    window = [date - dt.timedelta(days=i) for i in range(history.lookback_days + 1)]
    activity = (
        lake.scan("user_activity", root=root)
        .filter(pl.col("date").is_in(window))
        .filter(pl.col("user_id").is_in(events["user_id"].unique().implode()))
        .select("user_id", "ts", "item_id", "action", "surface")
        .collect()
    )
    past = (
        lake.scan("events", root=root)
        .filter(pl.col("date").is_in(window[1:]))
        .select("date", "surface", "ad_id", "user_id", "click", "click_ts")
        .collect()
    )
    joined = attach_history(events.sort("ts", "request_id"), activity, history.max_len)
    c = features.counters
    counted = attach_counters(joined, past, date, c.prior_strength, c.joint_passes, moments=c.moments)
    return counted.select(list(schema)).cast(schema)  # type: ignore[arg-type]


def leakage_report(df: pl.DataFrame) -> dict[str, float | int]:
    """Counts of history values that are not strictly before their impression or out of order."""
    seconds = df["hist_seconds_before"]
    flat = seconds.explode().drop_nulls()
    # Oldest first means seconds_before never increases along a history.
    unordered = seconds.list.eval(pl.element().diff().drop_nulls() > 0).list.any().sum() if df.height else 0
    return {
        "history_values": len(flat),
        "not_before_impression": int((flat <= 0).sum()) if len(flat) else 0,
        "unordered_histories": int(unordered or 0),
        "null_histories": int(seconds.is_null().sum()),
        "min_seconds_before": float(flat.min()) if len(flat) else 0.0,  # type: ignore[arg-type]
    }
