"""`training_examples` and the simulator's `oracle` run their GX suites (assets/expectations/<table>.json) before
the Delta commit, as ingest does for `events` and `user_activity`: a partition that fails is not written and the
failure names the expectation (training_examples: its blocking `gx_suite` check); a clean one is written."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from gem_model.data.synthetic import write_synthetic_lake
from gem_pipelines.assets import features, ingest
from gem_pipelines.data import lake as lake_io
from gem_pipelines.data import simulator
from gem_pipelines.data.validation import load_suite_spec
from gem_pipelines.resources import LakeResource, SimulatorResource

DAY = dt.date(2026, 11, 2)


@pytest.fixture
def day_frame(gem_home: Path) -> pl.DataFrame:
    """One day of training examples as the join builds them (a synthetic lake's, which its suite accepts)."""
    write_synthetic_lake(str(gem_home / "synthetic"), [DAY], 400, seed=3)
    return pl.read_delta(str(gem_home / "synthetic" / "training_examples"))


def _materialize(gem_home: Path, frame: pl.DataFrame, monkeypatch) -> dg.ExecuteInProcessResult:
    monkeypatch.setattr(features, "build_training_examples", lambda date, spec, root: frame)
    lake = LakeResource(root=str(gem_home / "lake"))
    return dg.materialize([features.training_examples], partition_key=DAY.isoformat(), resources={"lake": lake},
                          raise_on_error=False)


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "gx_suite"]
    return evaluation


def _simulate(gem_home: Path, monkeypatch, corrupt_oracle: bool) -> dg.ExecuteInProcessResult:
    real = simulator.simulate_partition

    def simulate(*args):
        sim = real(*args)
        if corrupt_oracle:  # a probability above 1: what a broken simulator change would write
            return dataclasses.replace(sim, oracle=sim.oracle.with_columns(pl.col("p_click") * 0 + 1.5))
        return sim

    monkeypatch.setattr(simulator, "simulate_partition", simulate)
    resources = {"lake": LakeResource(root=str(gem_home / "lake")),
                 "simulator": SimulatorResource(impressions_per_day=400)}
    return dg.materialize([ingest.raw_logs], partition_key=f"{DAY.isoformat()}|feed", resources=resources,
                          raise_on_error=False)


def test_a_partition_failing_its_suite_is_not_written(gem_home, day_frame, monkeypatch) -> None:
    bad = day_frame.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(pl.lit(50.0))
                                 .otherwise(pl.col("ad_click_logit_before")).alias("ad_click_logit_before"))
    result = _materialize(gem_home, bad, monkeypatch)
    assert not result.success
    check = _check(result)
    assert not check.passed and check.asset_key == dg.AssetKey("training_examples")
    failed = check.metadata["failed_expectations"].value
    assert "ad_click_logit_before" in failed and "expect_column_values_to_be_between" in failed
    assert check.metadata["failed"].value == 1
    assert not lake_io.table_exists("training_examples", root=str(gem_home / "lake"))
    assert (gem_home / "reports" / "data_docs" / "index.html").is_file()  # the failed run has its page


def test_a_clean_partition_is_written_with_its_suite_passed(gem_home, day_frame, monkeypatch) -> None:
    result = _materialize(gem_home, day_frame, monkeypatch)
    assert result.success
    check = _check(result)
    assert check.passed and check.metadata["evaluated"].value == check.metadata["successful"].value > 40
    written = pl.read_delta(str(gem_home / "lake" / "training_examples"))
    assert written.height == day_frame.height and set(written["date"]) == {DAY}


def test_an_oracle_failing_its_suite_is_not_written(gem_home, monkeypatch) -> None:
    result = _simulate(gem_home, monkeypatch, corrupt_oracle=True)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    failed = failure.step_failure_data.user_failure_data
    assert "oracle is not written" in failed.description and "p_click" in failed.metadata["failed_expectations"].value
    assert not lake_io.table_exists("oracle", root=str(gem_home / "lake"))


def test_a_simulated_oracle_is_written_with_its_suite_passed(gem_home, monkeypatch) -> None:
    result = _simulate(gem_home, monkeypatch, corrupt_oracle=False)
    assert result.success
    (oracle,) = [m for m in result.get_asset_materialization_events() if m.asset_key == dg.AssetKey("oracle")]
    meta = oracle.materialization.metadata
    assert meta["success"].value and meta["failed"].value == 0 and meta["evaluated"].value == len(load_suite_spec("oracle")["expectations"])
    assert pl.read_delta(str(gem_home / "lake" / "oracle")).height == meta["rows"].value > 0
