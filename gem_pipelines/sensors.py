"""Sensors: ingest a partition when its raw files appear (or change) in landing/; run the
automation conditions of every asset."""


import json

import dagster as dg

from gem_model.store.paths import gem_home
from gem_pipelines.data.formats import LANDING_FILES
from gem_pipelines.jobs import ingest_job
from gem_pipelines.partitions import SURFACES, date_partitions_def, multi_key


def last_ingested(instance: dg.DagsterInstance | None, key: str) -> float:
    """When `events` of this partition was last materialized (0 if never, or with no instance)."""
    if instance is None:
        return 0.0
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("events"), asset_partitions=[key]), limit=1
    ).records
    return records[0].timestamp if records else 0.0


def scan_landing(cursor: dict[str, float], instance: dg.DagsterInstance | None = None
                 ) -> tuple[list[dg.RunRequest], dict[str, float]]:
    """Partitions whose complete set of raw files is newer than the cursor and than their last ingest
    (files the daily schedule landed and ingested itself are not ingested twice)."""
    root = gem_home() / "landing"
    valid_dates = set(date_partitions_def.get_partition_keys())
    requests, new_cursor = [], dict(cursor)
    for surface in SURFACES.surfaces:
        base = root / surface.name
        if not base.is_dir():
            continue
        for day_dir in sorted(base.iterdir()):
            if day_dir.name not in valid_dates:
                continue
            files = [day_dir / name for name in LANDING_FILES[surface.format]]
            if not all(f.is_file() for f in files):
                continue  # still landing: wait until every file of the format is there
            mtime = max(f.stat().st_mtime for f in files)
            partition = multi_key(day_dir.name, surface.name)
            key = str(partition)  # the cursor's and the event log's key: Dagster's own "<date>|<surface>"
            if mtime > cursor.get(key, 0.0):
                new_cursor[key] = mtime
                if mtime <= last_ingested(instance, key):
                    continue
                requests.append(
                    dg.RunRequest(
                        run_key=f"landing-{key}-{mtime:.6f}",
                        partition_key=partition,
                        tags={"gem/trigger": "landing"},
                    )
                )
    return requests, new_cursor


def landing_cursor() -> str:
    """The cursor of everything in landing/ now: what `make demo` hands the sensor, so that
    switching it on does not ingest the demo's partitions again."""
    return json.dumps(scan_landing({})[1], sort_keys=True)


@dg.sensor(job=ingest_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Ingest every date x surface partition whose complete set of raw files is new in landing/ "
           "(cursor: the files' modification times).")
def landing_sensor(context: dg.SensorEvaluationContext):
    cursor = json.loads(context.cursor) if context.cursor else {}
    requests, new_cursor = scan_landing(cursor, context.instance)
    context.update_cursor(json.dumps(new_cursor, sort_keys=True))
    if not requests:
        return dg.SkipReason("no new raw files in landing/")
    return requests


automation_sensor = dg.AutomationConditionSensorDefinition(
    "automation_sensor",
    target=dg.AssetSelection.all(),
    # A tick's several partitions of one asset go to the backfill daemon, which runs parents before
    # children (separate runs would start together and read the parents' old data); every partition
    # mapping names only partitions that exist, or the daemon refuses the backfill (test_automation.py).
    emit_backfills=True,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Evaluates every asset's automation condition: features and models follow new data, the "
    "foundation model retrains on its cadence, each waiting for its upstream blocking checks.",
)


@dg.sensor(minimum_interval_seconds=300, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Marks every asset partition older than one of its inputs as stale (an observation naming "
           "the newer inputs), e.g. the foundation model after a re-ingest until its weekly retrain.")
def stale_sensor(context: dg.SensorEvaluationContext):
    from gem_pipelines.staleness import stale_marks

    stale, marks = stale_marks(context.instance, context.repository_def.asset_graph)
    if not marks:
        return dg.SkipReason(f"{len(stale)} stale partition(s), each already marked")
    return dg.SensorResult(asset_events=marks)
