"""The graph on object storage: a 4-day window x 3 surfaces materialized through a Dagster instance with
GEM_LAKE_URI=s3://... on moto's S3 server (127.0.0.1), credentials only from the environment. Every lake
table must end up in the bucket (none on local disk), the training stream, the teacher's oracle floor
and the distillation report read them back from there, and the secret key appears in no output, log,
metadata or file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml
from s3_server import SECRET, moto_s3  # tests/pipelines/ is on sys.path (rootdir import mode)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TABLES = ("events", "user_activity", "events_quarantine", "oracle", "training_examples", "teacher_predictions")
CHECKS = [
    ("events", "gx_suite"),
    ("user_activity", "gx_suite"),
    ("events", "row_conservation"),
    ("training_examples", "no_leakage"),
    ("training_examples", "gx_suite"),
    ("foundation_model", "quality_gate"),
]


def shrink_to_window(assets: Path) -> list[str]:
    """4 days with teacher lag 0 (warm-up, teacher, validation, evaluation) and three surfaces: social keeps
    two (feed, reels), so it has a domain model (the hierarchical path); commerce keeps one (marketplace),
    so it has none (a one-surface domain has no hierarchical path)."""
    cal = yaml.safe_load((assets / "calendar.yaml").read_text())
    cal.update(days=4, teacher_lag_days=0)
    (assets / "calendar.yaml").write_text(yaml.safe_dump(cal))
    spec = yaml.safe_load((assets / "surfaces.yaml").read_text())
    keep = {"feed": 0.45, "reels": 0.25, "marketplace": 0.3}
    spec["surfaces"] = [dict(s, traffic_share=keep[s["name"]]) for s in spec["surfaces"] if s["name"] in keep]
    (assets / "surfaces.yaml").write_text(yaml.safe_dump(spec))
    return sorted(keep)


def files_containing(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.timeout(600)
def test_window_materializes_on_s3(e2e_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    surfaces = shrink_to_window(Path(e2e_env["GEM_ASSETS_DIR"]))
    home = Path(e2e_env["GEM_HOME"])
    with moto_s3() as s3:
        env = {**e2e_env, **s3.env(), "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("window_driver.py"))], env=env,
                              capture_output=True, text=True, timeout=560, cwd=REPO)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        print(proc.stdout)  # per-run timings, shown with -s
        assert SECRET not in proc.stdout + proc.stderr

        # every table is in the bucket, nothing in a local lake
        assert not (home / "lake").exists()
        for table in TABLES:
            assert s3.keys(f"lake/{table}/_delta_log/"), f"{table} has no Delta log in the bucket"
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        from gem_model.store.paths import storage_options, table_uri

        def read(table: str) -> pl.DataFrame:
            return pl.read_delta(table_uri(table), storage_options=storage_options(table_uri(table)))

        events = read("events")
        assert events.group_by("date", "surface").len().height == 4 * len(surfaces)
        assert events["request_id"].is_unique().all()
        examples = read("training_examples")
        assert examples.height == events.height
        assert set(events["request_id"]) <= set(read("oracle")["request_id"])
        tp = read("teacher_predictions")
        assert set(tp["teacher"]) == {"foundation", "domain:social"}  # commerce has one surface: no domain model
        assert tp["date"].n_unique() == 3 and tp.select("request_id", "teacher").is_unique().all()

    # the teacher trained from the S3 stream, was gated and ACCEPTED, and scored against the S3 oracle
    accepted = (home / "models" / "foundation_model" / "ACCEPTED").read_text().strip()
    assert (home / "models" / "foundation_model" / accepted / "model.pt").exists()
    rows = json.loads((home / "reports" / "foundation_eval.json").read_text())["rows"]
    assert {r["surface"] for r in rows} == set(surfaces)
    assert all(r["oracle_ne"] is not None and r["n"] > 0 for r in rows)
    report = json.loads((home / "reports" / "distillation_report.json").read_text())["rows"]
    assert {(r["arm"], r["surface"]) for r in report if r["split"] == "evaluation"} >= {
        (a, s) for a in ("labels_only", "standard_kd") for s in surfaces
    }

    os.environ["DAGSTER_HOME"] = e2e_env["DAGSTER_HOME"]
    with dg.DagsterInstance.get() as instance:
        for asset, check in CHECKS:
            records = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(asset), check), limit=100
            )
            assert records and all(r.status.value == "SUCCEEDED" for r in records), f"{asset}:{check}"
        runs = instance.get_run_records()
        assert runs and all(r.dagster_run.is_success for r in runs)
        logged = "".join(str(e) for r in runs for e in instance.all_logs(r.dagster_run.run_id))
        assert "delta_version" in logged  # the materializations' metadata is in there
        assert SECRET not in logged
    # nor in any file the run left behind: run storage, reports, models, launch configs, W&B
    assert files_containing(home, SECRET.encode()) == []
