"""Jobs: asset selections the schedule, the sensor and the demo launch, plus lake maintenance."""


import dagster as dg

from gem_pipelines.checks import freshness_checks
from gem_pipelines.data import lake as lake_io
from gem_pipelines.resources import LakeResource

# Freshness checks run on their own sensor, not inside every materialization run.
_FRESHNESS = dg.AssetSelection.checks(*freshness_checks)

LAKE_TABLES = ("events", "user_activity", "events_quarantine", "oracle", "training_examples", "teacher_predictions")

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
features_job = dg.define_asset_job(
    "features_job",
    selection=dg.AssetSelection.assets("training_examples") - _FRESHNESS,
    description="Build training_examples for one date.",
)

foundation_job = dg.define_asset_job(
    "foundation_job", selection=dg.AssetSelection.assets("foundation_model"),
    description="Train, evaluate and gate the GEM teacher (and the single-surface baselines).",
)
domain_models_job = dg.define_asset_job(
    "domain_models_job", selection=dg.AssetSelection.assets("domain_models"),
    description="Distill one domain foundation model from the ACCEPTED teacher.",
)
teacher_predictions_job = dg.define_asset_job(
    "teacher_predictions_job", selection=dg.AssetSelection.assets("teacher_predictions"),
    description="Cache every teacher's predictions and embeddings for one date.",
)
distillation_report_job = dg.define_asset_job(
    "distillation_report_job", selection=dg.AssetSelection.assets("distillation_report"),
    description="Every transfer arm x path x surface, side by side.",
)
students_job = dg.define_asset_job(
    "students_job", selection=dg.AssetSelection.assets("students"),
    description="Train and export the production student of one surface.",
)


class MaintenanceConfig(dg.Config):
    retention_hours: int = 168


@dg.op
def compact_and_vacuum(context: dg.OpExecutionContext, config: MaintenanceConfig, lake: LakeResource) -> None:
    """OPTIMIZE (compact small files) then VACUUM with a retention of at least 7 days."""
    for table in LAKE_TABLES:
        if not lake_table_exists(table, lake):
            context.log.info(f"{table}: not created yet, skipped")
            continue
        result = lake_optimize(table, lake, config.retention_hours)
        context.log.info(f"{table}: {result}")


def lake_table_exists(table: str, res: LakeResource) -> bool:
    return lake_io.table_exists(table, root=res.uri())


def lake_optimize(table: str, res: LakeResource, retention_hours: int) -> dict[str, object]:
    return lake_io.optimize_and_vacuum(table, retention_hours=retention_hours, root=res.uri())


@dg.job(description="Weekly Delta maintenance: compact and vacuum every lake table.")
def lake_maintenance_job() -> None:
    compact_and_vacuum()
