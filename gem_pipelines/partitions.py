"""Partitions derive from assets/: dates from calendar.yaml, surfaces and domains from surfaces.yaml."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from gem_model.config import load_calendar, load_surfaces

CALENDAR = load_calendar()
SURFACES = load_surfaces()


def date_partitions(first_role_day: bool = False) -> dg.DailyPartitionsDefinition:
    """Every day of the window; with `first_role_day`, from the first day with a role (the warm-up
    day only feeds histories, so a per-day model output there would show as "missing" forever)."""
    start = (CALENDAR.start + dt.timedelta(days=int(first_role_day))).isoformat()
    end = None if CALENDAR.days == "open" else (CALENDAR.end() + dt.timedelta(days=1)).isoformat()
    return dg.DailyPartitionsDefinition(start_date=start, end_date=end, timezone="UTC")


date_partitions_def = date_partitions()
role_date_partitions_def = date_partitions(first_role_day=True)
surface_partitions_def = dg.StaticPartitionsDefinition(SURFACES.names)
domain_partitions_def = dg.StaticPartitionsDefinition(SURFACES.domains)
date_surface_partitions_def = dg.MultiPartitionsDefinition(
    {"date": date_partitions_def, "surface": surface_partitions_def}
)


def split_key(context: dg.AssetExecutionContext) -> tuple[dt.date, str]:
    """(date, surface) of a date x surface run."""
    # a run launched from a tag (UI, schedule, sensor) carries the key as a plain "<date>|<surface>" string
    keys = date_surface_partitions_def.get_partition_key_from_str(str(context.partition_key)).keys_by_dimension
    return dt.date.fromisoformat(keys["date"]), keys["surface"]


def multi_key(date: dt.date | str, surface: str) -> dg.MultiPartitionKey:
    d = date if isinstance(date, str) else date.isoformat()
    return dg.MultiPartitionKey({"date": d, "surface": surface})
