"""The daily schedule and the landing sensor ask for the right runs."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import dagster as dg

from gem_pipelines.data.formats import LANDING_FILES
from gem_pipelines.partitions import CALENDAR, SURFACES
from gem_pipelines.schedules import daily_ingest_schedule
from gem_pipelines.sensors import landing_sensor


def test_daily_schedule_requests_yesterday_for_every_surface() -> None:
    day = CALENDAR.start + dt.timedelta(days=2)
    tick = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(1, 30), tzinfo=dt.UTC)
    with dg.build_schedule_context(scheduled_execution_time=tick) as ctx:
        requests = daily_ingest_schedule(ctx)
    assert sorted(str(r.partition_key) for r in requests) == sorted(f"{day}|{s}" for s in SURFACES.names)
    assert len({r.run_key for r in requests}) == len(SURFACES.names)


def test_daily_schedule_skips_days_outside_the_calendar() -> None:
    tick = dt.datetime(2031, 1, 1, 1, 30, tzinfo=dt.UTC)
    with dg.build_schedule_context(scheduled_execution_time=tick) as ctx:
        result = daily_ingest_schedule(ctx)
    assert isinstance(result, dg.SkipReason)


def _land(gem_home: Path, surface: str, day: dt.date, files: tuple[str, ...]) -> None:
    d = gem_home / "landing" / surface / day.isoformat()
    d.mkdir(parents=True, exist_ok=True)
    for name in files:
        (d / name).write_text("x\n")


def test_landing_sensor_requests_new_complete_partitions_once(gem_home: Path) -> None:
    day = CALENDAR.start
    feed = SURFACES.get("feed")
    market = next(s for s in SURFACES.surfaces if s.format == "csv_ms")
    _land(gem_home, feed.name, day, LANDING_FILES[feed.format])
    _land(gem_home, market.name, day, LANDING_FILES[market.format][:1])  # incomplete: wait
    _land(gem_home, feed.name, dt.date(2030, 1, 1), LANDING_FILES[feed.format])  # not in calendar
    ctx = dg.build_sensor_context(cursor=None)
    result = landing_sensor(ctx)
    assert [str(r.partition_key) for r in result] == [f"{day}|{feed.name}"]
    cursor = ctx.cursor
    assert f"{day}|{feed.name}" in json.loads(cursor)
    # same files again: nothing new
    assert isinstance(landing_sensor(dg.build_sensor_context(cursor=cursor)), dg.SkipReason)
    # the missing file lands, and feed's file is rewritten: both partitions are requested
    _land(gem_home, market.name, day, LANDING_FILES[market.format])
    f = gem_home / "landing" / feed.name / day.isoformat() / LANDING_FILES[feed.format][0]
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 10))
    result = landing_sensor(dg.build_sensor_context(cursor=cursor))
    assert sorted(str(r.partition_key) for r in result) == sorted([f"{day}|{feed.name}", f"{day}|{market.name}"])
