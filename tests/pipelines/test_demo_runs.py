"""After `make demo` (the session's demo world): every run is a run of the workspace's code location,
listed on its job page with the current job snapshot, and every schedule and sensor is RUNNING."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import dagster as dg
import pytest
from dagster._core.storage.tags import REPOSITORY_LABEL_TAG
from dagster._core.workspace.load import location_origins_from_yaml_paths

from gem_model.config import REPO_ROOT

pytestmark = pytest.mark.slow

# 5 days x 4 surfaces, then features per day, then the models (teacher predictions skip the warm-up day).
EXPECTED_RUNS = {"land_and_ingest_job": 20, "features_job": 5, "foundation_job": 1, "domain_models_job": 2,
                 "teacher_predictions_job": 4, "distillation_report_job": 1, "students_job": 4}
README_NAMES = {"daily_ingest_schedule", "weekly_maintenance_schedule", "landing_sensor", "automation_sensor",
                "freshness_checks_sensor", "stale_sensor"}


def _status(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gem_pipelines.code_location"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(1800)
def test_every_demo_run_is_a_run_of_the_code_location(demo_world, monkeypatch) -> None:
    env, proc = demo_world
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    status = _status(env)
    (origin,) = location_origins_from_yaml_paths([str(REPO_ROOT / "workspace.yaml")])
    assert status["location"] == origin.location_name
    label = status["repository_label"]
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs()
        assert Counter(r.job_name for r in runs) == EXPECTED_RUNS
        for run in runs:
            assert run.is_success, run.run_id
            assert run.remote_job_origin is not None, f"{run.job_name} {run.run_id} has no code-location origin"
            assert run.remote_job_origin.location_name == origin.location_name
            assert run.remote_job_origin.repository_origin.get_label() == label  # stored as a run tag
            # the snapshot the UI compares for re-execution ("origin-and-snapshot": no version warning)
            assert run.job_snapshot_id == status["jobs"][run.job_name], f"{run.job_name}: snapshot differs"
        for job, n in EXPECTED_RUNS.items():  # what the job page lists: runs of the job under this location
            listed = instance.get_runs(dg.RunsFilter(job_name=job, tags={REPOSITORY_LABEL_TAG: label}))
            assert len(listed) == n, job
        partitioned = instance.get_runs(dg.RunsFilter(job_name="land_and_ingest_job"))
        assert {r.tags["dagster/partition"] for r in partitioned} == {
            f"{d}|{s}" for d in ("2026-11-02", "2026-11-03", "2026-11-04", "2026-11-05", "2026-11-06")
            for s in ("feed", "reels", "marketplace", "shops")
        }


@pytest.mark.timeout(1800)
def test_automation_is_running_after_the_demo_and_ingests_nothing_twice(demo_world) -> None:
    env, proc = demo_world
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    status = _status(env)
    instigators = status["instigators"]
    assert set(instigators) == README_NAMES
    for name, state in instigators.items():
        assert state["status"] == "RUNNING", name
        assert state["description"], f"{name} has no description"
    # the landing sensor's cursor knows every partition the demo landed: switched on, it ingests nothing
    assert len(json.loads(instigators["landing_sensor"]["cursor"])) == 20
    assert status["landing_sensor_would_request"] == []


@pytest.mark.timeout(1800)
def test_model_reports_are_tables_plots_and_links(demo_world, monkeypatch) -> None:
    """Evaluation and distillation reports read in the UI: markdown tables and inline plots, and the
    report files as links (served URL + path relative to GEM_HOME), never frozen absolute paths."""
    env, proc = demo_world
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])

    def meta(asset: str, partition: str | None = None) -> dict:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
            limit=1).records
        return records[0].asset_materialization.metadata

    def table(value, *cols: str) -> bool:
        header = value.md_str.splitlines()[0]
        return isinstance(value, dg.MarkdownMetadataValue) and all(f" {c} " in header for c in cols)

    def plot(value) -> bool:
        return isinstance(value, dg.MarkdownMetadataValue) and value.md_str.startswith("![plot](data:image/png;base64,")

    with dg.DagsterInstance.get() as instance:
        for asset, file in (("foundation_model", "foundation_eval.html"), ("distillation_report", "distillation_report.html")):
            m = meta(asset)
            assert isinstance(m["report"], dg.UrlMetadataValue) and m["report"].url.endswith(f"/{file}"), asset
            assert m["report_path"].path == f"reports/{file}", asset  # relative to GEM_HOME: survives a move
        foundation, report, student = meta("foundation_model"), meta("distillation_report"), meta("students", "feed")
        assert table(foundation["per_surface"], "surface", "task", "ne", "oracle_ne") and plot(foundation["loss_curve"])
        assert table(report["table"], "arm", "path", "split", "surface", "ne") and plot(report["click_ne_by_arm"])
        assert table(student["evaluation"], "surface", "task", "ne")
        assert student["warm_start_from"].value == "cold: no ACCEPTED student to start from"  # the demo's first
