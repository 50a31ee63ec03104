"""Jobs: asset selections the schedule, the sensor and the demo launch, plus lake maintenance."""


import dagster as dg

from gem_pipelines.checks import freshness_checks
from gem_pipelines.data import lake as lake_io
from gem_pipelines.resources import LakeResource

# Freshness checks run on their own sensor, not inside every materialization run.
_FRESHNESS = dg.AssetSelection.checks(*freshness_checks)

land_and_ingest_job = dg.define_asset_job(
    "land_and_ingest_job",
    selection=dg.AssetSelection.assets("raw_logs", "oracle", "events", "user_activity", "events_quarantine") - _FRESHNESS,
    description="Land one day of one surface (simulator or landing/) and ingest it into the lake.",
)
ingest_job = dg.define_asset_job(
    "ingest_job",
    selection=dg.AssetSelection.assets("events", "user_activity", "events_quarantine") - _FRESHNESS,
    description="Ingest raw files already in landing/ for one date x surface partition.",
)
# One job per asset for the date-, domain-, surface- and un-partitioned stages the demo drives in order.
_SINGLE_ASSET_JOBS = {
    "training_examples": "Record one date's user_activity, then build training_examples for that date.",
    "foundation_model": "Train, evaluate and gate the GEM teacher (and the single-surface baselines).",
    "domain_models": "Distill one domain foundation model from the ACCEPTED teacher.",
    "teacher_predictions": "Refresh the foundation that serves one date, then cache every teacher's predictions "
                           "and embeddings for it.",
    "distillation_report": "Every transfer arm x path x surface, side by side.",
    "students": "Train and export the production student of one surface.",
}
_JOB_NAMES = {"training_examples": "features_job"}
# training_examples' histories read activity_by_day: the features job builds both for its date; a date's
# predictions read the foundation refreshed for it (a no-op where nothing new entered its window).
_WITH = {"training_examples": ("activity_by_day",), "teacher_predictions": ("foundation_refresh",)}
single_asset_jobs = [
    dg.define_asset_job(
        _JOB_NAMES.get(asset, f"{asset.removesuffix('_model')}_job"),
        selection=dg.AssetSelection.assets(*_WITH.get(asset, ()), asset) - _FRESHNESS,
        description=description,
    )
    for asset, description in _SINGLE_ASSET_JOBS.items()
]


# The job each automation-targeted asset runs in: `make next-day` launches what the automation requests
# under these names (an asset subset of the job), so the job pages list the automation's runs beside
# the demo's instead of the hidden asset job's jobless materializations.
AUTOMATION_JOB_OF = {
    member: job.name
    for job, asset in zip(single_asset_jobs, _SINGLE_ASSET_JOBS, strict=True)
    for member in (*_WITH.get(asset, ()), asset)
}


def automation_job_for(asset_keys: list[dg.AssetKey]) -> str | None:
    """The one job that holds every asset of an automation request (None: no single job does)."""
    jobs = {AUTOMATION_JOB_OF.get(k.to_user_string()) for k in asset_keys}
    return jobs.pop() if len(jobs) == 1 and None not in jobs else None


class MaintenanceConfig(dg.Config):
    retention_hours: int = 168


@dg.op
def compact_and_vacuum(context: dg.OpExecutionContext, config: MaintenanceConfig, lake: LakeResource) -> None:
    """OPTIMIZE (compact small files) then VACUUM with a retention of at least 7 days."""
    for table in lake_io.PARTITION_COLUMNS:
        if not lake_io.table_exists(table, root=lake.uri()):
            context.log.info(f"{table}: not created yet, skipped")
            continue
        result = lake_io.optimize_and_vacuum(table, retention_hours=config.retention_hours, root=lake.uri())
        context.log.info(f"{table}: {result}")


@dg.job(description="Weekly Delta maintenance: compact and vacuum every lake table.")
def lake_maintenance_job() -> None:
    compact_and_vacuum()
