"""A slice of the real Douban sample through the real graph: `GEM_DATA=douban python -m
gem_pipelines.demo` (what `make demo DATA=douban` runs) on a 4-day window and the tiny model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from gem_model.config import ASSETS_DIR
from tests.sources.helpers import need, run_demo_slice

pytestmark = pytest.mark.slow
USER_MOD = 24  # keep users with id % USER_MOD == 0: ~110 users, ~13k rows in all three domains


def _slice(src: Path, dest: Path) -> dict[str, int]:
    """The sample's files, restricted to a set of users (their rows in every domain kept whole)."""
    dest.mkdir()
    rows = {}
    for f in sorted(src.glob("douban_*.csv")):
        df = pl.read_csv(f, infer_schema=False)
        df = df.filter(pl.col("1").cast(pl.Int64) % USER_MOD == 0)
        df.write_csv(dest / f.name)
        rows[f.name] = df.height
    return rows


def _assets(dest: Path) -> Path:
    shutil.copytree(ASSETS_DIR, dest)
    douban = dest / "sources" / "douban"
    # the shortest window: warm-up, one teacher/student day (no lag), validation E-1, evaluation E
    cal = douban / "calendar.yaml"
    cal.write_text(yaml.safe_dump({**yaml.safe_load(cal.read_text()), "days": 4, "teacher_lag_days": 0}))
    # a slice's day of music is a few dozen rows: its click rate may be anything
    suite = json.loads((douban / "expectations" / "events.json").read_text())
    for e in suite["expectations"]:
        if e["type"] == "expect_column_mean_to_be_between":
            e["kwargs"].update(min_value=0.0, max_value=1.0)
    (douban / "expectations" / "events.json").write_text(json.dumps(suite))
    # a slice of ~110 users: the shared (smaller) id tables keep the tiny model's steps cheap, with
    # Douban's own dense inputs (its counters) and counter settings
    shared, own_features = (yaml.safe_load(f.read_text()) for f in (dest / "features.yaml", douban / "features.yaml"))
    shared.update(dense=own_features["dense"], counters=own_features["counters"])
    (douban / "features.yaml").write_text(yaml.safe_dump(shared))
    tiny = dest / "models" / "tiny.yaml"
    spec = yaml.safe_load(tiny.read_text())
    # ... and Douban's own start of the heads on them (models/small.yaml), so the graph runs the option
    own = yaml.safe_load((douban / "models" / "small.yaml").read_text())["train"]
    spec["train"].update(max_steps=25, dense_prior=own["dense_prior"])
    tiny.write_text(yaml.safe_dump(spec))
    quality = yaml.safe_load((dest / "quality.yaml").read_text())
    # the gate has its own tests; 25 steps of the tiny model on a slice only have to run (NE not judged)
    quality["model_gate"].update(min_positives=5, max_ne=50.0, max_vs_labels_only=50.0)
    (dest / "quality.yaml").write_text(yaml.safe_dump(quality))
    return dest


@pytest.mark.timeout(600)
def test_douban_slice_runs_the_whole_graph(tmp_path: Path) -> None:
    rows = _slice(need("douban_multidomain"), tmp_path / "douban")
    home = tmp_path / "gem"
    run_demo_slice("douban", tmp_path / "douban", _assets(tmp_path / "assets"), home)

    # every real row accounted for, per file, recounted from the lake
    acc = json.loads((home / "reports" / "source_accounting.json").read_text())
    assert acc["all_accounted"]
    assert {r["source_file"]: r["read"] for r in acc["files"]} == rows
    assert all(r["imported"] == r["read"] and r["quarantined"] == 0 for r in acc["files"])
    events = pl.read_delta(str(home / "lake" / "events"))
    assert events.height == sum(rows.values()) and events["request_id"].is_unique().all()
    assert set(events["surface"]) == {"music", "book", "movie"}
    examples = pl.read_delta(str(home / "lake" / "training_examples"))
    last = examples.filter(pl.col("date") == examples["date"].max())
    assert last["hist_item_id"].list.len().mean() > 1  # cross-domain histories reach the test day
    assert set(last["hist_surface"].explode().drop_nulls()) >= {"book", "movie"}
    # the counters of the earlier days reach it too (Douban's features.yaml lists them as dense inputs)
    assert (last["user_all_impressions_before"] > 0).mean() > 0.5 and last["ad_click_logit_before"].abs().max() > 0

    # no oracle: the reports say so and give bootstrap intervals instead
    found = json.loads((home / "reports" / "foundation_eval.json").read_text())["rows"]
    assert found and all(r["oracle_ne"] is None for r in found)
    report = json.loads((home / "reports" / "real_data_report.json").read_text())
    assert report["oracle"].startswith("none")
    assert report["hierarchical"] == {d: "not applicable: the domain has one surface" for d in ("book", "movie", "music")}
    by_surface = {r["surface"]: r for r in report["rows"] if r["task"] == "click"}
    assert set(by_surface) == {"music", "book", "movie"}
    assert by_surface["movie"]["peer_ne"] == 0.805
    for r in by_surface.values():
        for model in ("foundation", "single_surface"):
            m = r[model]
            assert m["n"] > 0
            for k in ("ne", "auc", "calibration"):  # each figure inside an interval of its own resamples
                lo, hi = m[f"{k}_ci"]
                assert lo < hi and lo <= m[k] <= hi, (r["surface"], model, k)
        d = r["foundation_minus_single"]  # the two models on the same rows of E, paired
        assert d["n"] == r["foundation"]["n"] == r["single_surface"]["n"] and d["lo"] < d["hi"]
        assert d["diff"] == pytest.approx(r["foundation"]["ne"] - r["single_surface"]["ne"])
        assert d["verdict"] == ("a better" if d["hi"] < 0 else "b better" if d["lo"] > 0 else "no difference shown")
    assert "| movie | click |" in (home / "reports" / "real_data_report.md").read_text()

    # distillation: the direct path for every surface, the hierarchical one reported not applicable
    dist = json.loads((home / "reports" / "distillation_report.json").read_text())["rows"]
    for s in ("music", "book", "movie"):
        direct = [r for r in dist if r["surface"] == s and r["path"] == "direct" and r["split"] == "evaluation"]
        assert direct and all(r["ne"] is not None for r in direct)
        hier = [r for r in dist if r["surface"] == s and r["path"] == "hierarchical"]
        assert hier and all(r["ne"] is None and r["status"].startswith("not applicable") for r in hier)
        student = home / "models" / "students" / s
        assert (student / (student / "ACCEPTED").read_text().strip() / "student.pt2").exists()
    assert not (home / "models" / "domain_models").exists()  # no domain model where no hierarchy exists

    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    with dg.DagsterInstance.get() as instance:
        for asset, check in [("events", "gx_suite"), ("events", "row_conservation"), ("user_activity", "gx_suite"),
                             ("training_examples", "gx_suite")]:
            records = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(asset), check), limit=1000)
            statuses = {r.status.value for r in records}
            assert statuses == {"SUCCEEDED"}, f"{asset}:{check}: {statuses}"
        runs = instance.get_run_records()
        assert runs and all(r.dagster_run.is_success for r in runs)
