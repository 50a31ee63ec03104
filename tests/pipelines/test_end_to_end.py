"""Materialize the whole graph for a 5-day window x every surface through a Dagster instance (the
same driver as `make demo`), then assert on the tables and on the recorded check results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from gem_model.config import load_surfaces
from gem_pipelines.quality_gate import untraced_accepted

pytestmark = pytest.mark.slow

CHECKS = [
    ("events", "gx_suite"),
    ("user_activity", "gx_suite"),
    ("events", "row_conservation"),
    ("events_quarantine", "quarantine_rate"),
    ("training_examples", "no_leakage"),
    ("training_examples", "gx_suite"),
    ("foundation_model", "quality_gate"),
    ("domain_models", "quality_gate"),
    ("students", "quality_gate"),
]


@pytest.mark.timeout(1600)
def test_demo_materializes_the_graph_with_green_checks(demo_world) -> None:
    e2e_env, proc = demo_world  # the session's one demo run (conftest.py), shared with the automation tests
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lake = Path(e2e_env["GEM_HOME"]) / "lake"
    surfaces = load_surfaces(Path(e2e_env["GEM_ASSETS_DIR"]) / "surfaces.yaml").names

    events = pl.read_delta(str(lake / "events"))
    assert events["request_id"].is_unique().all()
    assert events.schema["date"] == pl.Date
    per_partition = events.group_by("date", "surface").len()
    assert per_partition.height == 5 * len(surfaces)
    # the tests' small world (conftest.small_assets), not one leaked from the environment
    # (GEM_SIMULATOR=eval once made every end-to-end subprocess simulate simulator_eval.yaml's 80,000 a day)
    per_day = yaml.safe_load((Path(e2e_env["GEM_ASSETS_DIR"]) / "simulator.yaml").read_text())["impressions_per_day"]
    assert events.height < 1.2 * 5 * per_day  # Poisson counts around it
    quarantine = pl.read_delta(str(lake / "events_quarantine"))
    assert quarantine.height > 0 and quarantine["reason"].null_count() == 0
    examples = pl.read_delta(str(lake / "training_examples"))
    assert examples.height == events.height
    assert (examples["hist_seconds_before"].explode().drop_nulls() > 0).all()
    assert examples["hist_item_id"].list.len().mean() > 1  # cross-surface histories are there
    oracle = pl.read_delta(str(lake / "oracle"))
    assert set(events["request_id"]) <= set(oracle["request_id"])

    home = Path(e2e_env["GEM_HOME"])
    # the foundation model: gated, ACCEPTED, evaluated against the oracle with baselines for every surface
    accepted = (home / "models" / "foundation_model" / "ACCEPTED").read_text().strip()
    assert (home / "models" / "foundation_model" / accepted / "model.pt").exists()
    report = json.loads((home / "reports" / "foundation_eval.json").read_text())["rows"]
    assert {(r["model"], r["surface"]) for r in report if r["task"] == "click"} == {
        (m, s) for m in ("foundation", "single_surface") for s in surfaces
    }
    assert all(r["oracle_ne"] is not None and r["n"] > 0 for r in report)
    # E's NE by the ad's age (issue 24): churn gives E ads never seen before
    by_age = json.loads((home / "reports" / "foundation_eval.json").read_text())["ne_by_ad_age"]
    assert {(r["surface"], r["ad_age"]) for r in by_age} == {(s, a) for s in [*surfaces, "all"] for a in ("new", "recent", "older")}
    assert next(r["n"] for r in by_age if r["surface"] == "all" and r["ad_age"] == "new") > 0
    # every teacher's predictions cached once, keyed by (request_id, teacher)
    tp = pl.read_delta(str(lake / "teacher_predictions"))
    assert {"foundation", "domain:social", "domain:commerce"} <= set(tp["teacher"])
    assert tp.select("request_id", "teacher").is_unique().all()
    # the distillation report has every arm x path x surface x split, and each surface a served student
    rows = json.loads((home / "reports" / "distillation_report.json").read_text())["rows"]
    cells = {(r["arm"], r["path"], r["surface"], r["split"]) for r in rows}
    for s in surfaces:
        for split in ("validation", "evaluation"):
            assert ("labels_only", "none", s, split) in cells
            for arm in ("standard_kd", "parameter_sharing"):
                assert {(arm, p, s, split) for p in ("direct", "hierarchical")} <= cells
        student = home / "models" / "students" / s
        version = (student / "ACCEPTED").read_text().strip()
        assert (student / version / "student.pt2").exists()

    os.environ["DAGSTER_HOME"] = e2e_env["DAGSTER_HOME"]
    with dg.DagsterInstance.get() as instance:
        for asset, check in CHECKS:
            records = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(asset), check), limit=1000
            )
            statuses = {r.status.value for r in records}
            assert "SUCCEEDED" in statuses, f"{asset}:{check} never passed"
            # a model accepted unjudged (too few positives on E: the test world's shops) fails with WARN
            failed = [r.event.dagster_event.event_specific_data for r in records if r.status.value == "FAILED"]
            assert all(e.severity == dg.AssetCheckSeverity.WARN and "judged" in e.metadata
                       and e.metadata["judged"].value is False for e in failed), f"{asset}:{check} failed: {statuses}"
        runs = instance.get_run_records()
        assert runs and all(r.dagster_run.is_success for r in runs)
        # every model is gated, and every ACCEPTED file traces to a passing quality_gate check of its version
        accepted = sorted(str(p.relative_to(home / "models")) for p in (home / "models").glob("**/ACCEPTED"))
        assert {p.split("/")[0] for p in accepted} == {"foundation_model", "domain_models", "students"}, accepted
        assert untraced_accepted(instance, home) == []
