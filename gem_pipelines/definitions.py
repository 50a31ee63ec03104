"""The Dagster code location: `defs` is what workspace.yaml loads."""

from __future__ import annotations

import dagster as dg

from gem_pipelines.assets.features import training_examples
from gem_pipelines.assets.foundation import foundation_model
from gem_pipelines.assets.ingest import ingest, raw_logs
from gem_pipelines.assets.students import distillation_report, domain_models, students, teacher_predictions
from gem_pipelines.checks import freshness_checks, freshness_sensor
from gem_pipelines.jobs import (
    distillation_report_job,
    domain_models_job,
    features_job,
    foundation_job,
    ingest_job,
    lake_maintenance_job,
    land_and_ingest_job,
    students_job,
    teacher_predictions_job,
)
from gem_pipelines.resources import resources_for
from gem_pipelines.schedules import daily_ingest_schedule, weekly_maintenance_schedule
from gem_pipelines.sensors import landing_sensor

defs = dg.Definitions(
    assets=[raw_logs, ingest, training_examples, foundation_model, domain_models, teacher_predictions,
            distillation_report, students],
    asset_checks=freshness_checks,
    jobs=[land_and_ingest_job, ingest_job, features_job, foundation_job, domain_models_job, teacher_predictions_job,
          distillation_report_job, students_job, lake_maintenance_job],
    schedules=[daily_ingest_schedule, weekly_maintenance_schedule],
    sensors=[landing_sensor, freshness_sensor],
    resources=resources_for(),
)
