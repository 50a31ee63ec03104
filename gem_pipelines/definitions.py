"""The Dagster code location: `defs` is what workspace.yaml loads."""

from __future__ import annotations

import dagster as dg

from gem_pipelines.assets.features import activity_by_day, training_examples
from gem_pipelines.assets.foundation import foundation_model
from gem_pipelines.assets.ingest import ingest, raw_logs
from gem_pipelines.assets.refresh import foundation_refresh
from gem_pipelines.assets.students import distillation_report, domain_models, students, teacher_predictions
from gem_pipelines.catalog import annotate
from gem_pipelines.checks import freshness_checks, freshness_sensor
from gem_pipelines.jobs import ingest_job, lake_maintenance_job, land_and_ingest_job, single_asset_jobs
from gem_pipelines.k8s import executor_for
from gem_pipelines.resources import resources_for
from gem_pipelines.schedules import daily_ingest_schedule, weekly_maintenance_schedule
from gem_pipelines.sensors import automation_sensor, landing_sensor, stale_sensor

defs = dg.Definitions(
    assets=annotate([raw_logs, ingest, activity_by_day, training_examples, foundation_model, foundation_refresh,
                     domain_models, teacher_predictions, distillation_report, students]),
    asset_checks=freshness_checks,
    jobs=[land_and_ingest_job, ingest_job, *single_asset_jobs, lake_maintenance_job],
    schedules=[daily_ingest_schedule, weekly_maintenance_schedule],
    sensors=[landing_sensor, freshness_sensor, automation_sensor, stale_sensor],
    resources=resources_for(),
    executor=executor_for(),  # GEM_EXECUTOR=k8s: one pod per step (docs/deploy_kubernetes.md)
)
