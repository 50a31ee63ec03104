"""The Dagster instance under $GEM_HOME/dagster that `make demo` and `make ui` share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from gem_model.store.atomic import write_text
from gem_model.store.paths import gem_home

if TYPE_CHECKING:
    from gem_pipelines.code_location import CodeLocation

# Concurrency pools: dagster.yaml caps every pool at 1 (the gpu pool: one training step per GPU);
# ingest is set wider here, since named limits live in the instance's storage, not its yaml.
POOL_LIMITS = {"gpu": 1, "ingest": 4}

DAGSTER_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    granularity: op
    default_limit: 1   # any pool without an explicit limit (e.g. gpu): one step at a time
"""


def dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or gem_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        write_text(cfg, DAGSTER_YAML)
    return home


def get_instance() -> dg.DagsterInstance:
    dagster_home()
    instance = dg.DagsterInstance.get()
    for pool, limit in POOL_LIMITS.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    return instance


def start_automation(location: CodeLocation) -> list[str]:
    """Switch every schedule and sensor on, as the UI's toggles would, and hand the landing sensor a
    cursor that already knows the files the demo ingested (it must not ingest them again)."""
    from gem_pipelines.next_day import seed_automation_cursor
    from gem_pipelines.sensors import landing_cursor, landing_sensor

    started = []
    for schedule in location.repo.get_schedules():
        location.start_schedule(schedule.name)
        started.append(f"{schedule.name} RUNNING")
    for sensor in location.repo.get_sensors():
        cursor = landing_cursor() if sensor.name == landing_sensor.name else None
        location.start_sensor(sensor.name, cursor=cursor)
        started.append(f"{sensor.name} RUNNING" + (f" (cursor: {len(json.loads(cursor))} partitions)" if cursor else ""))
    seed_automation_cursor(location.instance)
    return started
