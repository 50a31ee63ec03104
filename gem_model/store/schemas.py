"""The lake's data contract: enum domains and the schemas of every Delta table.

It lives in gem_model because the model consumes these tables (training_examples, oracle) and
imports point gem_pipelines -> gem_model; the ingest side re-exports it from
gem_pipelines.data.formats next to the raw formats it parses.
"""

from __future__ import annotations

import polars as pl

OBJECTIVES = ("awareness", "traffic", "app_installs", "conversions")
CREATIVE_FORMATS = ("image", "video", "carousel", "collection")
DEVICES = ("ios", "android", "web")
ORGANIC_ACTIONS = ("view", "like", "comment", "share", "save", "click")
PAID_ACTIONS = ("click", "conversion")
ACTIONS = ("view", "like", "comment", "share", "save", "click", "conversion")
SOURCES = ("organic", "paid")

UTC_US = pl.Datetime("us", "UTC")

EVENTS_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "ts": UTC_US,
    "date": pl.Date(),
    "surface": pl.String(),
    "domain": pl.String(),
    "user_id": pl.Int64(),
    "ad_id": pl.Int64(),
    "advertiser_id": pl.Int64(),
    "objective": pl.String(),
    "creative_format": pl.String(),
    "device": pl.String(),
    "position": pl.Int32(),
    "bid": pl.Float64(),
    "user_tenure_days": pl.Float64(),
    "hour_of_day": pl.Int32(),
    "click": pl.Int8(),
    "click_ts": UTC_US,
    "conversion": pl.Int8(),  # null where the surface does not log conversions
    "conversion_ts": UTC_US,
}

USER_ACTIVITY_SCHEMA: dict[str, pl.DataType] = {
    "user_id": pl.Int64(),
    "ts": UTC_US,
    "date": pl.Date(),
    "surface": pl.String(),
    "item_id": pl.Int64(),
    "action": pl.String(),
    "source": pl.String(),
}

QUARANTINE_SCHEMA: dict[str, pl.DataType] = {
    "surface": pl.String(),
    "date": pl.Date(),
    "source_file": pl.String(),
    "line_no": pl.Int64(),
    "raw": pl.String(),
    "reason": pl.String(),
    "detail": pl.String(),
}

ORACLE_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "date": pl.Date(),
    "surface": pl.String(),
    "p_click": pl.Float64(),
    "p_conversion": pl.Float64(),
}

HISTORY_COLUMNS: dict[str, pl.DataType] = {
    "hist_item_id": pl.List(pl.Int64()),
    "hist_action": pl.List(pl.String()),
    "hist_surface": pl.List(pl.String()),
    "hist_seconds_before": pl.List(pl.Float64()),
}

# Counter features (gem_pipelines/data/counters.py) over the earlier days of the history lookback window:
# impressions and click log-odds shrunk to (and relative to) the surface's rate, of the row's ad and user on
# its surface, of the user on every surface (user_all) and on every other surface (user_other), and of the ad
# on every other surface (ad_other).
COUNTER_COLUMNS: dict[str, pl.DataType] = {
    f"{who}_{what}_before": pl.Float64()
    for who in ("ad", "user", "user_all", "user_other", "ad_other")
    for what in ("impressions", "click_logit")
}

# Same-day counters (counters.py `_attach_today`): the row's ad earlier on the row's own day, on its surface
# (ad_today) and on every surface (ad_all_today): impressions strictly before the row's `ts` and the clicks on
# them known (`click_ts`) by then. A real-time counter: an ad born today has no earlier day to count.
TODAY_COUNTER_COLUMNS: dict[str, pl.DataType] = {
    f"{who}_{what}_before": pl.Float64()
    for who in ("ad_today", "ad_all_today")
    for what in ("impressions", "click_logit")
}

# The counters that read other surfaces, each with its one-surface counterpart: what a single-surface
# model reads in their place (gem_model.data.own_surface; None: nothing, read as 0 = no evidence).
CROSS_SURFACE_COUNTERS: dict[str, str | None] = {
    "user_all_impressions_before": "user_impressions_before",
    "user_all_click_logit_before": "user_click_logit_before",
    "user_other_impressions_before": None,
    "user_other_click_logit_before": None,
    "ad_other_impressions_before": None,
    "ad_other_click_logit_before": None,
    "ad_all_today_impressions_before": "ad_today_impressions_before",
    "ad_all_today_click_logit_before": "ad_today_click_logit_before",
}

TRAINING_EXAMPLES_SCHEMA: dict[str, pl.DataType] = {
    **EVENTS_SCHEMA, **HISTORY_COLUMNS, **COUNTER_COLUMNS, **TODAY_COUNTER_COLUMNS,
}


def context_schema(context: dict[str, str]) -> dict[str, pl.DataType]:
    """A dataset's own log columns (features.yaml `context: true`) as they land: dense Float64, categorical text."""
    if taken := sorted(set(context) & set(TRAINING_EXAMPLES_SCHEMA)):
        raise ValueError(f"features.yaml: context features {taken} name columns of the unified schema; drop `context: true`")
    return {name: pl.Float64() if kind == "dense" else pl.String() for name, kind in context.items()}


def events_schema(context: dict[str, str]) -> dict[str, pl.DataType]:
    """`events` of a dataset whose log adds context columns: the unified schema, then those columns."""
    return {**EVENTS_SCHEMA, **context_schema(context)}


def training_examples_schema(context: dict[str, str]) -> dict[str, pl.DataType]:
    return {**TRAINING_EXAMPLES_SCHEMA, **context_schema(context)}
