"""Freshness checks (and the sensor that runs them); suites and gates live beside their assets.

Dagster (1.13.27, the pin in pyproject.toml; DAGSTER_VERSION) has no public way to describe a check that its
freshness factory built: `_with_description` rebuilds the definition from `get_attributes_dict()` through the
public `dg.AssetChecksDefinition` class, as Dagster's own repository loader does. tests/pipelines/test_checks.py
fails when an upgrade changes what that rebuild keeps.
"""

from __future__ import annotations

import datetime as dt
import warnings

import dagster as dg

from gem_pipelines.settings import QUALITY

DAGSTER_VERSION = "1.13.27"

# What writes each asset: the freshness check's description says what a failure means.
_WRITTEN_BY = {
    "events": "the daily ingest schedule (01:30 UTC) and the landing sensor write the newest day of the window",
    "training_examples": "the automation sensor rebuilds the newest day's examples once its events are ingested",
}


def _description(name: str, hours: float) -> str:
    return (
        f"Fails when no partition of `{name}` was written in the last {hours:g} h (`freshness_hours` in "
        f"assets/quality.yaml), counted on the wall clock when freshness_checks_sensor evaluates it (every 5 min). "
        f"Once a day {_WRITTEN_BY[name]}, so {hours:g} h allows one late run. In the demo world the newest day "
        "is the simulator's clock ($GEM_HOME/clock.json), which only `make next-day` moves: left alone, the "
        f"check fails {hours:g} h after the last new day, as a production lake whose feed stopped would."
    )


def _with_description(checks_def: dg.AssetsDefinition, description: str) -> dg.AssetsDefinition:
    """Dagster's factory gives every freshness check the same text ("Evaluates freshness for targeted
    asset."); the same check definition, with its spec described."""
    attrs = checks_def.get_attributes_dict()
    attrs["check_specs_by_output_name"] = {
        out: dg.AssetCheckSpec(spec.name, asset=spec.asset_key, description=description, blocking=spec.blocking,
                               metadata=spec.metadata)
        for out, spec in attrs["check_specs_by_output_name"].items()
    }
    with warnings.catch_warnings():  # the attributes name `execution_type`, a beta parameter
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.AssetChecksDefinition(**attrs)  # as Dagster's own repository loader rebuilds check definitions


# Dagster 1.13 prefers FreshnessPolicy, which has no check results to show or gate on; we want checks.
warnings.filterwarnings("ignore", message=".*freshness_checks.*superseded", category=Warning)
freshness_checks = [
    _with_description(check, _description(name, getattr(QUALITY.freshness_hours, name)))
    for name in ("events", "training_examples")
    for check in dg.build_last_update_freshness_checks(
        assets=[dg.AssetKey(name)], lower_bound_delta=dt.timedelta(hours=getattr(QUALITY.freshness_hours, name))
    )
]
freshness_sensor = dg.build_sensor_for_freshness_checks(
    freshness_checks=freshness_checks, name="freshness_checks_sensor", minimum_interval_seconds=300
)
