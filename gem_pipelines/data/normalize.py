"""Row-level rules: a staging frame becomes clean `events` and organic `user_activity` rows, and
every record that breaks a rule goes to quarantine with exactly one reason code.

Each staging row ends in exactly one place (an events row, a click/conversion merged into an
events row, an organic activity row, or quarantine), so nothing can vanish: the conservation check
recounts the raw files independently and compares.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import cached_property

import polars as pl

from gem_model.config import Surface
from gem_pipelines.data.formats import (
    CREATIVE_FORMATS,
    DEVICES,
    OBJECTIVES,
    ORGANIC_ACTIONS,
    QUARANTINE_SCHEMA,
    USER_ACTIVITY_SCHEMA,
    events_schema,
)
from gem_pipelines.data.parsers import TS_UNIT

KINDS = ("impression", "click", "conversion", "organic")
LABEL_WINDOW = dt.timedelta(hours=24)
# The events suite's position range (assets/expectations/events.json): a row rule, so one record outside it is
# quarantined instead of failing the suite and blocking its whole partition.
POSITIONS = (1, 50)
_TRUE = ("true", "1")
_FALSE = ("false", "0")


@dataclass
class NormalizedPartition:
    events: pl.DataFrame
    organic: pl.DataFrame
    quarantine: pl.DataFrame
    raw_records: int
    merged_label_events: int
    reasons: dict[str, int] = field(default_factory=dict)

    @cached_property
    def paid(self) -> pl.DataFrame:
        """Clicks and conversions on ads, as activity at their own time (derived, never counted twice)."""
        return pl.concat([
            self.events.filter(pl.col(action) == 1).select(
                "user_id", ts=f"{action}_ts", date="date", surface="surface", item_id="ad_id",
                action=pl.lit(action), source=pl.lit("paid"),
            )
            for action in ("click", "conversion")
        ]).select(list(USER_ACTIVITY_SCHEMA)).cast(USER_ACTIVITY_SCHEMA)  # type: ignore[arg-type]  # fmt: skip

    @cached_property
    def user_activity(self) -> pl.DataFrame:
        return pl.concat([self.organic, self.paid]).select(list(USER_ACTIVITY_SCHEMA))

    def counts(self) -> dict[str, int]:
        return {
            "raw_records": self.raw_records,
            "impressions": self.events.height,
            "merged_label_events": self.merged_label_events,
            "organic": self.organic.height,
            "quarantined": self.quarantine.height,
        }


def _ts(col: str, unit: str) -> pl.Expr:
    c = pl.col(col)
    if unit == "iso":
        return c.str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
    if unit == "ms":
        return pl.from_epoch(c.cast(pl.Int64, strict=False), "ms").dt.replace_time_zone("UTC").dt.cast_time_unit("us")
    if unit == "s":
        micros = (c.cast(pl.Float64, strict=False) * 1e6).round(0).cast(pl.Int64, strict=False)
        return pl.from_epoch(micros, "us").dt.replace_time_zone("UTC")
    return pl.from_epoch(c.cast(pl.Int64, strict=False), "us").dt.replace_time_zone("UTC")


def _flag(col: str) -> pl.Expr:
    c = pl.col(col).str.to_lowercase()
    return pl.when(c.is_in(_TRUE)).then(pl.lit(1, pl.Int8)).when(c.is_in(_FALSE)).then(pl.lit(0, pl.Int8))


def _int(col: str, dtype: pl.DataType = pl.Int64) -> pl.Expr:
    # "3.0" is a float in an int field: bad_type, like Delta's silent 2.7 -> 2 we refuse to do.
    return pl.col(col).cast(dtype, strict=False)


def _bad(col: str, typed: str) -> pl.Expr:
    """A value was present but did not cast to its type."""
    return pl.col(col).is_not_null() & pl.col(typed).is_null()


def _first_reason(rules: list[tuple[str, pl.Expr]]) -> pl.Expr:
    expr = pl.when(pl.col("parse_reason").is_not_null()).then(pl.col("parse_reason"))
    for reason, cond in rules:
        expr = expr.when(cond).then(pl.lit(reason))
    return expr.otherwise(pl.lit(None, dtype=pl.String))


def _missing(*cols: str) -> pl.Expr:
    return pl.any_horizontal(pl.col(*cols).is_null())


def _within_window(col: str, start: str) -> pl.Expr:
    """A label time at or after `start` and at most LABEL_WINDOW later."""
    return (pl.col(col) >= pl.col(start)) & (pl.col(col) <= pl.col(start) + LABEL_WINDOW)


def normalize_partition(
    stage: pl.DataFrame, surface: Surface, date: dt.date, context: dict[str, str] | None = None
) -> NormalizedPartition:
    """Apply the row-level rules to one partition's staging frame. `context`: the dataset's own log
    columns by kind (features.yaml `context: true`); a dense one that is not a number is bad_type."""
    context = context or {}
    dense = [c for c, kind in context.items() if kind == "dense"]
    unit = TS_UNIT[surface.format]
    day_start = dt.datetime.combine(date, dt.time(), tzinfo=dt.UTC)
    day_end = day_start + dt.timedelta(days=1)
    has_conversion = "conversion" in surface.tasks

    typed = stage.with_columns(
        **{f"{c}_t": _ts(c, unit) for c in ("ts", "click_ts", "conversion_ts")},
        **{f"{c}_t": _int(c) for c in ("user_id", "ad_id", "advertiser_id", "item_id")},
        position_t=_int("position", pl.Int32),
        bid_t=pl.col("bid").cast(pl.Float64, strict=False),
        tenure_t=pl.col("user_tenure_days").cast(pl.Float64, strict=False),
        **{f"{c}_t": _flag(c) for c in ("click", "conversion")},
        **{f"context.{c}_t": pl.col(f"context.{c}").cast(pl.Float64, strict=False) for c in dense},
    )
    kind = pl.col("kind")
    imp, org, lab = kind == "impression", kind == "organic", kind.is_in(["click", "conversion"])
    in_day = (pl.col("ts_t") >= day_start) & (pl.col("ts_t") < day_end)
    label_ts_ok = (pl.col("click_ts_t").is_null() | _within_window("click_ts_t", "ts_t")) & (
        pl.col("conversion_ts_t").is_null() | _within_window("conversion_ts_t", "ts_t")
    )
    # Row formats carry labels inline; the event stream derives them from click/conversion events.
    inline_labels = surface.format != "event_stream"
    bad_label = pl.lit(False)
    if inline_labels:
        bad_label = pl.any_horizontal(
            _bad("click", "click_t"), pl.col("click").is_null(), _bad("click_ts", "click_ts_t"),
            _bad("conversion", "conversion_t"), _bad("conversion_ts", "conversion_ts_t"),
            (pl.col("click_t") == 1) & pl.col("click_ts_t").is_null(),
            pl.lit(has_conversion) & pl.col("conversion").is_null(),
            # without the task, a conversion is unexpected_label, whatever its time
            pl.lit(has_conversion) & (pl.col("conversion_t") == 1) & pl.col("conversion_ts_t").is_null(),
        )
    enums = {"objective": OBJECTIVES, "creative_format": CREATIVE_FORMATS, "device": DEVICES}
    rules: list[tuple[str, pl.Expr]] = [
        ("unknown_enum", kind.is_null() | ~kind.is_in(KINDS)),
        ("missing_id", imp & _missing("request_id", "user_id", "ad_id", "advertiser_id")),
        ("missing_id", org & _missing("user_id", "item_id")),
        ("missing_id", lab & _missing("request_id")),
        ("bad_type", imp & pl.any_horizontal(
            _bad("user_id", "user_id_t"), _bad("ad_id", "ad_id_t"), _bad("advertiser_id", "advertiser_id_t"),
            pl.col("position_t", "bid_t", "ts_t").is_null(), _bad("user_tenure_days", "tenure_t"), bad_label,
            *(_bad(f"context.{c}", f"context.{c}_t") for c in dense),
        )),
        ("bad_type", org & (_bad("user_id", "user_id_t") | _bad("item_id", "item_id_t") | pl.col("ts_t").is_null())),
        ("bad_type", lab & pl.col("ts_t").is_null()),
        ("unknown_enum", imp & ~pl.all_horizontal(pl.col(c).is_in(v).fill_null(False) for c, v in enums.items())),
        ("unknown_enum", org & ~pl.col("action").is_in(ORGANIC_ACTIONS).fill_null(False)),
        ("out_of_range_value", imp & pl.any_horizontal(
            ~pl.col("bid_t", "tenure_t").is_finite(),  # NaN reads as null to the suites
            pl.col("bid_t", "tenure_t", "ad_id_t", "advertiser_id_t") < 0,
            ~pl.col("position_t").is_between(*POSITIONS),
        )),
        ("out_of_range_value", org & (pl.col("item_id_t") < 0)),  # item ids share the ads' id space
        ("out_of_range_value", pl.col("user_id_t") < 0),
        ("out_of_range_ts", (imp | org) & ~in_day),
        ("out_of_range_ts", imp & ~label_ts_ok),
        ("unexpected_label", pl.lit(not has_conversion) & ((kind == "conversion") | (imp & (pl.col("conversion_t") == 1)))),
    ]  # fmt: skip
    typed = typed.with_columns(reason=_first_reason(rules))

    # Duplicates: of the records that passed every rule so far, the first copy wins.
    ok = pl.col("reason").is_null()
    dup_key = (
        pl.when(imp)
        .then(pl.lit("i|") + pl.col("request_id"))
        .when(lab)
        .then(kind + "|" + pl.col("request_id"))
        .otherwise(pl.lit("o|") + pl.col("raw").str.strip_chars())
    )
    typed = typed.with_columns(dup_key=pl.when(ok).then(dup_key))
    typed = typed.with_columns(
        reason=pl.when(ok & pl.col("dup_key").is_duplicated() & ~pl.col("dup_key").is_first_distinct())
        .then(pl.lit("duplicate_record"))
        .otherwise(pl.col("reason"))
    )
    ok = pl.col("reason").is_null()
    impressions = typed.filter(ok & imp)
    # Click/conversion events: join with their impression, or they are orphans.
    events_lab = typed.filter(ok & lab).join(
        impressions.select("request_id", imp_ts=pl.col("ts_t")), on="request_id", how="left"
    )
    lab_reason = (
        pl.when(pl.col("imp_ts").is_null())
        .then(pl.lit("orphan_event"))
        .when(~_within_window("ts_t", "imp_ts"))
        .then(pl.lit("out_of_range_ts"))
    )
    events_lab = events_lab.with_columns(reason=lab_reason)
    bad_lab = events_lab.filter(pl.col("reason").is_not_null()).drop("imp_ts")
    good_lab = events_lab.filter(pl.col("reason").is_null())

    if not inline_labels:
        clicks = good_lab.filter(kind == "click").select("request_id", click_ev_ts=pl.col("ts_t"))
        convs = good_lab.filter(kind == "conversion").select("request_id", conv_ev_ts=pl.col("ts_t"))
        impressions = (
            impressions.join(clicks, on="request_id", how="left")
            .join(convs, on="request_id", how="left")
            .with_columns(
                click_t=pl.col("click_ev_ts").is_not_null().cast(pl.Int8),
                click_ts_t=pl.col("click_ev_ts"),
                conversion_t=pl.col("conv_ev_ts").is_not_null().cast(pl.Int8) if has_conversion else pl.lit(None, pl.Int8),
                conversion_ts_t=pl.col("conv_ev_ts"),
            )
        )
    elif not has_conversion:
        impressions = impressions.with_columns(conversion_t=pl.lit(None, pl.Int8), conversion_ts_t=pl.lit(None))

    events = impressions.sort("ts_t", "line_no").select(
        request_id="request_id",
        ts="ts_t",
        date=pl.lit(date, pl.Date),
        surface=pl.lit(surface.name),
        domain=pl.lit(surface.domain),
        user_id="user_id_t",
        ad_id="ad_id_t",
        advertiser_id="advertiser_id_t",
        objective="objective",
        creative_format="creative_format",
        device="device",
        position="position_t",
        bid="bid_t",
        user_tenure_days=pl.col("tenure_t").fill_null(0.0),
        hour_of_day=pl.col("ts_t").dt.hour().cast(pl.Int32),
        click="click_t",
        click_ts=pl.when(pl.col("click_t") == 1).then(pl.col("click_ts_t")),
        conversion="conversion_t",
        conversion_ts=pl.when(pl.col("conversion_t") == 1).then(pl.col("conversion_ts_t")),
        **{c: pl.col(f"context.{c}_t" if kind == "dense" else f"context.{c}") for c, kind in context.items()},
    ).cast(events_schema(context))  # type: ignore[arg-type]

    organic = (
        typed.filter(ok & org)
        .sort("ts_t", "line_no")
        .select(
            user_id="user_id_t",
            ts="ts_t",
            date=pl.lit(date, pl.Date),
            surface=pl.lit(surface.name),
            item_id="item_id_t",
            action="action",
            source=pl.lit("organic"),
        )
        .cast(USER_ACTIVITY_SCHEMA)  # type: ignore[arg-type]
    )

    qcols = ["source_file", "line_no", "raw", "reason"]
    quarantine = (
        pl.concat([typed.filter(pl.col("reason").is_not_null()).select(qcols), bad_lab.select(qcols)])
        .with_columns(
            surface=pl.lit(surface.name),
            date=pl.lit(date, pl.Date),
            detail=pl.lit(None, pl.String),
        )
        .sort("source_file", "line_no")
        .select(list(QUARANTINE_SCHEMA))
        .cast(QUARANTINE_SCHEMA)  # type: ignore[arg-type]
    )
    reasons = dict(quarantine.group_by("reason").len().iter_rows())
    return NormalizedPartition(
        events=events,
        organic=organic,
        quarantine=quarantine,
        raw_records=stage.height,
        merged_label_events=good_lab.height,
        reasons={k: int(v) for k, v in sorted(reasons.items())},
    )
