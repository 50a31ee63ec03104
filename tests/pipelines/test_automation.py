"""The daily schedule and the landing sensor ask for the right runs."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import dagster as dg

from gem_pipelines.data.formats import LANDING_FILES
from gem_pipelines.partitions import CALENDAR, SURFACES
from gem_pipelines.schedules import daily_ingest_schedule, ingest_requests_for
from gem_pipelines.sensors import landing_sensor


def test_daily_schedule_requests_yesterday_of_the_simulator_clock_for_every_surface() -> None:
    """In a fixed window "yesterday" is the window's last day E, whatever the wall clock says."""
    tick = dt.datetime(2031, 1, 1, 1, 30, tzinfo=dt.UTC)
    with dg.instance_for_test() as instance, dg.build_schedule_context(instance=instance,
                                                                      scheduled_execution_time=tick) as ctx:
        requests = daily_ingest_schedule(ctx)
        assert sorted(str(r.partition_key) for r in requests) == sorted(f"{CALENDAR.end()}|{s}" for s in SURFACES.names)
        assert len({r.run_key for r in requests}) == len(SURFACES.names)
        # once a surface of E is ingested, only the others are asked for; then nothing
        instance.report_runless_asset_event(dg.AssetMaterialization("events", partition=f"{CALENDAR.end()}|feed"))
        requests = daily_ingest_schedule(ctx)
        assert sorted(str(r.partition_key) for r in requests) == sorted(
            f"{CALENDAR.end()}|{s}" for s in SURFACES.names if s != "feed"
        )
        for s in SURFACES.names:
            instance.report_runless_asset_event(dg.AssetMaterialization("events", partition=f"{CALENDAR.end()}|{s}"))
        skip = daily_ingest_schedule(ctx)
        assert isinstance(skip, dg.SkipReason) and "already ingested" in (skip.skip_message or "")


def test_daily_requests_skip_days_outside_the_calendar() -> None:
    skip = ingest_requests_for(dt.date(2031, 1, 1))
    assert isinstance(skip, dg.SkipReason) and "outside the calendar" in (skip.skip_message or "")


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
    instance = dg.DagsterInstance.ephemeral()
    ctx = dg.build_sensor_context(instance=instance, cursor=None)
    result = landing_sensor(ctx)
    assert [str(r.partition_key) for r in result] == [f"{day}|{feed.name}"]
    cursor = ctx.cursor
    assert f"{day}|{feed.name}" in json.loads(cursor)
    # same files again: nothing new
    assert isinstance(landing_sensor(dg.build_sensor_context(instance=instance, cursor=cursor)), dg.SkipReason)
    # the missing file lands, and feed's file is rewritten: both partitions are requested
    _land(gem_home, market.name, day, LANDING_FILES[market.format])
    f = gem_home / "landing" / feed.name / day.isoformat() / LANDING_FILES[feed.format][0]
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 10))
    result = landing_sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert sorted(str(r.partition_key) for r in result) == sorted([f"{day}|{feed.name}", f"{day}|{market.name}"])
    # files already ingested after they landed (the daily schedule landed them itself) are not asked for
    instance.report_runless_asset_event(dg.AssetMaterialization("events", partition=f"{day}|{market.name}"))
    result = landing_sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert [str(r.partition_key) for r in result] == [f"{day}|{feed.name}"]


def test_every_partition_of_every_asset_reads_partitions_that_exist() -> None:
    """What Dagster's backfill daemon checks before it runs an automation backfill: a date-partitioned
    asset reading a domain-partitioned one through the identity mapping "depends on non-existent
    partitions" (teacher_predictions[2026-11-05] -> domain_models[2026-11-05]) and the backfill fails,
    leaving stale partitions green."""
    from gem_pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    checked = 0
    for key in graph.materializable_asset_keys:
        child_pdef = graph.get(key).partitions_def
        for parent in graph.get(key).parent_keys:
            parent_pdef = graph.get(parent).partitions_def
            if parent_pdef is None:
                continue
            result = graph.get_partition_mapping(key, parent).get_upstream_mapped_partitions_result_for_partitions(
                child_pdef.subset_with_all_partitions() if child_pdef else None, child_pdef, parent_pdef)
            missing = list(result.required_but_nonexistent_subset.get_partition_keys())
            assert not missing, f"{key.to_user_string()} -> {parent.to_user_string()}: {missing[:3]}"
            checked += 1
    assert checked >= 10


def test_automation_requests_run_under_the_job_that_holds_their_assets() -> None:
    """`make next-day` launches what the automation requests under a named job (its job page lists the
    run), never the hidden asset job."""
    from gem_pipelines.jobs import automation_job_for

    keys = [dg.AssetKey(k) for k in ("activity_by_day", "training_examples")]
    assert automation_job_for(keys) == "features_job"
    assert automation_job_for(keys[1:]) == "features_job"
    assert automation_job_for([dg.AssetKey("teacher_predictions")]) == "teacher_predictions_job"
    assert automation_job_for([dg.AssetKey("students")]) == "students_job"
    assert automation_job_for([dg.AssetKey("students"), dg.AssetKey("training_examples")]) is None


def test_partitions_older_than_an_input_are_marked_stale_once() -> None:
    """A model trained on every day of examples (all-partition mapping) becomes stale when one day is
    rebuilt; the mark names that day, and is not repeated while nothing else changes."""
    from gem_pipelines.staleness import mark_stale, marked_inputs, stale_marks

    days = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-04")
    domains = dg.StaticPartitionsDefinition(["social", "commerce"])

    @dg.asset(partitions_def=days)
    def examples() -> None: ...

    @dg.asset(partitions_def=domains, deps=[dg.AssetDep(examples, partition_mapping=dg.AllPartitionMapping())])
    def model() -> None: ...

    from gem_pipelines.sensors import stale_sensor

    defs = dg.Definitions(assets=[examples, model], sensors=[stale_sensor])
    graph = defs.resolve_asset_graph()
    with dg.instance_for_test() as instance:
        for day in days.get_partition_keys():
            dg.materialize([examples], partition_key=day, instance=instance)
        for domain in ("social", "commerce"):
            dg.materialize([model], partition_key=domain, instance=instance, selection=[model])
        assert mark_stale(instance, graph) == {}
        dg.materialize([examples], partition_key="2026-11-02", instance=instance)
        newer = ["examples[2026-11-02]"]
        # the sensor `make ui` runs says so in the UI, as `make next-day` does
        ctx = dg.build_sensor_context(instance=instance, repository_def=defs.get_repository_def())
        assert sorted(e.partition for e in stale_sensor(ctx).asset_events) == ["commerce", "social"]
        assert mark_stale(instance, graph) == {"model[commerce]": newer, "model[social]": newer}
        assert marked_inputs(instance, "model[social]") == newer
        assert stale_marks(instance, graph)[1] == []  # already marked: nothing new to say
        dg.materialize([model], partition_key="social", instance=instance, selection=[model])
        assert mark_stale(instance, graph) == {"model[commerce]": newer}


def test_the_automation_cursor_is_kept_between_processes(gem_home: Path) -> None:
    """`make next-day` keeps the cursor of `dg.evaluate_automation_conditions` on disk (Dagster's public
    serializer): read back, it remembers what was requested, so the next evaluation does not ask again."""
    from gem_pipelines.next_day import _load_cursor, _save_cursor

    # requested while missing, unless the previous evaluation (which only the cursor remembers) requested it
    @dg.asset(automation_condition=dg.AutomationCondition.missing() & ~dg.AutomationCondition.newly_requested())
    def table() -> None: ...

    with dg.instance_for_test() as instance:
        assert _load_cursor() is None
        first = dg.evaluate_automation_conditions(defs=[table], instance=instance)
        assert first.total_requested == 1
        _save_cursor(first.cursor)
        assert dg.evaluate_automation_conditions(defs=[table], instance=instance, cursor=_load_cursor()).total_requested == 0
        assert dg.evaluate_automation_conditions(defs=[table], instance=instance).total_requested == 1  # no cursor
