"""gem_pipelines.code_location is the one module that uses Dagster's private API (written against
dagster==1.13.27): every private name it imports is used here, on a fresh instance, so an upgrade that moves or
changes one fails here rather than in the middle of `make demo` or `make next-day`."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from gem_pipelines.code_location import CodeLocation, status
from gem_pipelines.partitions import CALENDAR


def test_runs_are_created_and_executed_as_the_ui_would(gem_home: Path) -> None:
    with dg.instance_for_test() as instance:
        location = CodeLocation(instance)  # the workspace.yaml origin, loaded in this process
        assert location.name == "gem_pipelines.definitions"
        # executed here: the lake is empty, so maintenance skips every table
        run = location.launch("lake_maintenance_job", tags={"gem/trigger": "test"})
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.remote_job_origin is not None and run.remote_job_origin.location_name == location.name
        assert run.job_snapshot_id == status(location)["jobs"]["lake_maintenance_job"]  # type: ignore[index]
        assert run.tags["gem/trigger"] == "test"
        # what an automation request asks for: an asset subset of a job, for one partition (created only)
        day = CALENDAR.dates()[1].isoformat()
        pending = location.create_run("features_job", partition_key=day,
                                      asset_selection=[dg.AssetKey("training_examples")])
        assert pending.status == dg.DagsterRunStatus.NOT_STARTED
        assert pending.asset_selection == {dg.AssetKey("training_examples")}
        assert pending.tags["dagster/partition"] == day
        assert pending.remote_job_origin.job_name == "features_job"  # type: ignore[union-attr]


def test_schedule_and_sensor_state_is_stored_as_the_ui_toggles_would(gem_home: Path) -> None:
    with dg.instance_for_test() as instance:
        location = CodeLocation(instance)
        assert location.instigator_state("daily_ingest_schedule") is None
        location.start_schedule("daily_ingest_schedule")
        location.start_sensor("landing_sensor", cursor="{}")
        shown = status(location)["instigators"]
        assert shown["daily_ingest_schedule"]["status"] == "RUNNING"
        assert shown["landing_sensor"]["status"] == "RUNNING" and shown["landing_sensor"]["cursor"] == "{}"
        assert shown["stale_sensor"]["status"] == "DEFAULT"  # never switched: no state stored
        # a tick's new cursor is kept; switching on again updates the stored state instead of adding one
        location.set_sensor_cursor("landing_sensor", '{"a": 1.0}')
        assert location.sensor_cursor("landing_sensor") == '{"a": 1.0}'
        location.start_sensor("landing_sensor", cursor=None)
        assert location.sensor_cursor("landing_sensor") is None
        location.set_sensor_cursor("stale_sensor", "ignored")  # no state: nothing to update
        assert location.instigator_state("stale_sensor") is None


def test_the_demo_switches_every_schedule_and_sensor_on(gem_home: Path) -> None:
    """What `make demo` ends with: every schedule and sensor RUNNING, the landing sensor's cursor knowing what
    landed, and the automation's cursor on disk for `make next-day`."""
    from gem_pipelines.next_day import _load_cursor, start_automation

    with dg.instance_for_test() as instance:
        location = CodeLocation(instance)
        started = start_automation(location)
        shown = status(location)
        assert len(started) == len(shown["instigators"]) >= 6  # type: ignore[arg-type]
        assert {s["status"] for s in shown["instigators"].values()} == {"RUNNING"}  # type: ignore[union-attr]
        assert shown["instigators"]["landing_sensor"]["cursor"] == "{}"  # type: ignore[index]  # nothing landed
        assert _load_cursor() is not None
