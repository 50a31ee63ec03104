"""Freshness checks (and the sensor that runs them); suites and gates live beside their assets."""

from __future__ import annotations

import datetime as dt
import warnings

import dagster as dg

from gem_pipelines.settings import QUALITY

# Dagster 1.13 prefers FreshnessPolicy, which has no check results to show or gate on; we want checks.
warnings.filterwarnings("ignore", message=".*freshness_checks.*superseded", category=Warning)
freshness_checks = [
    check
    for name in ("events", "training_examples")
    for check in dg.build_last_update_freshness_checks(
        assets=[dg.AssetKey(name)], lower_bound_delta=dt.timedelta(hours=QUALITY.freshness_hours[name])
    )
]
freshness_sensor = dg.build_sensor_for_freshness_checks(
    freshness_checks=freshness_checks, name="freshness_checks_sensor", minimum_interval_seconds=300
)
