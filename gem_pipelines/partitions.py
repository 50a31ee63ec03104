"""Partitions derive from assets/: dates from calendar.yaml, surfaces and domains from surfaces.yaml."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from gem_model.config import load_calendar, load_surfaces

CALENDAR = load_calendar()
SURFACES = load_surfaces()


def date_partitions() -> dg.DailyPartitionsDefinition:
    start = CALENDAR.start.isoformat()
    if CALENDAR.days == "open":
        return dg.DailyPartitionsDefinition(start_date=start, timezone="UTC")
    end = (CALENDAR.end() + dt.timedelta(days=1)).isoformat()
    return dg.DailyPartitionsDefinition(start_date=start, end_date=end, timezone="UTC")


date_partitions_def = date_partitions()
surface_partitions_def = dg.StaticPartitionsDefinition(SURFACES.names)
domain_partitions_def = dg.StaticPartitionsDefinition(SURFACES.domains)
date_surface_partitions_def = dg.MultiPartitionsDefinition(
    {"date": date_partitions_def, "surface": surface_partitions_def}
)


def split_key(context: dg.AssetExecutionContext) -> tuple[dt.date, str]:
    """(date, surface) of a date x surface run."""
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    return dt.date.fromisoformat(keys["date"]), keys["surface"]


def multi_key(date: dt.date | str, surface: str) -> dg.MultiPartitionKey:
    d = date if isinstance(date, str) else date.isoformat()
    return dg.MultiPartitionKey({"date": d, "surface": surface})
