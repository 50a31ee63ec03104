"""checks.py describes the freshness checks by rebuilding Dagster's definitions (no public API does it): the
rebuild must keep everything but the description, and the sensor must still run the rebuilt checks."""

from __future__ import annotations

import tomllib
import warnings
from importlib.metadata import version
from pathlib import Path

import dagster as dg

from gem_pipelines import checks


def test_dagster_is_the_version_the_rebuild_was_written_for() -> None:
    pins = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert f"dagster=={checks.DAGSTER_VERSION}" in pins["dependencies"]
    assert version("dagster") == checks.DAGSTER_VERSION


def test_rebuilt_check_keeps_every_attribute_but_the_description() -> None:
    with warnings.catch_warnings():  # superseded by FreshnessPolicy, which has no check (see checks.py)
        warnings.simplefilter("ignore")
        (plain,) = dg.build_last_update_freshness_checks(assets=[dg.AssetKey("events")],
                                                         lower_bound_delta=checks.dt.timedelta(hours=36))
    rebuilt = checks._with_description(plain, "what a failure means")
    assert isinstance(rebuilt, dg.AssetChecksDefinition)
    before, after = plain.get_attributes_dict(), rebuilt.get_attributes_dict()
    specs_before, specs_after = before.pop("check_specs_by_output_name"), after.pop("check_specs_by_output_name")
    before["specs"], after["specs"] = list(before["specs"]), list(after["specs"])  # dict views compare by identity
    assert before == after
    assert specs_before.keys() == specs_after.keys()
    for out, spec in specs_after.items():
        assert spec.description == "what a failure means"
        assert spec._replace(description=specs_before[out].description) == specs_before[out]
    assert rebuilt.check_keys == plain.check_keys and rebuilt.node_def is plain.node_def


def test_the_freshness_sensor_runs_the_described_checks() -> None:
    defs = dg.Definitions(asset_checks=checks.freshness_checks, sensors=[checks.freshness_sensor])
    sensor = defs.get_sensor_def("freshness_checks_sensor")
    keys = {k for c in checks.freshness_checks for k in c.check_keys}
    assert sensor.asset_selection.resolve_checks(defs.resolve_asset_graph()) == keys
    for c in checks.freshness_checks:
        (spec,) = c.check_specs
        assert "Fails when no partition" in spec.description and spec.name == "freshness_check"
