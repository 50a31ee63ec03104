"""A slice of the real KuaiRand sample through the real graph: `GEM_DATA=kuairand python -m
gem_pipelines.demo` (what `make demo DATA=kuairand` runs) on its last 4 days and the tiny model.
The spec is the repository's; only the window's lag, the id tables and the gates are shrunk."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from gem_model.config import ASSETS_DIR
from tests.sources.helpers import need, run_demo_slice

pytestmark = pytest.mark.slow
LOG = "log_standard_pure_20220425_20220503.csv.gz"
FIRST_DAY = "20220430"  # 4 days: warm-up, one teacher/student day (no lag), validation E-1, evaluation E
USER_MOD = 8  # users with id % USER_MOD == 0: about 1/8 of the rows, every tab kept


def _slice(src: Path, dest: Path) -> int:
    """The log's last 4 days for a set of users (as text, byte for byte per line), and the side tables."""
    dest.mkdir()
    lines = gzip.decompress((src / LOG).read_bytes()).decode().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:]
                         if int(ln.split(",")[0]) % USER_MOD == 0 and ln.split(",")[2] >= FIRST_DAY]
    (dest / "log_standard_pure_slice.csv.gz").write_bytes(gzip.compress(("\n".join(keep) + "\n").encode()))
    for f in ("user_features_pure.csv", "video_features_basic_pure.csv"):
        shutil.copy(src / f, dest / f)
    return len(keep) - 1


def _assets(dest: Path) -> Path:
    shutil.copytree(ASSETS_DIR, dest)
    kr = dest / "sources" / "kuairand"
    spec = yaml.safe_load((kr / "source.yaml").read_text())
    spec["time"]["teacher_lag_days"] = 0
    (kr / "source.yaml").write_text(yaml.safe_dump(spec))
    suite = json.loads((kr / "expectations" / "events.json").read_text())
    for e in suite["expectations"]:  # a slice's (day, tab) is a few dozen rows: its click rate may be anything
        if e["type"] == "expect_column_mean_to_be_between":
            e["kwargs"].update(min_value=0.0, max_value=1.0)
    (kr / "expectations" / "events.json").write_text(json.dumps(suite))
    shared, own = (yaml.safe_load(f.read_text()) for f in (dest / "features.yaml", kr / "features.yaml"))
    # the shared (smaller) id tables, and KuaiRand's context features (its side tables' columns)
    shared.update(dense=own["dense"], counters=own["counters"],
                  sparse=shared["sparse"] + [f for f in own["sparse"] if f.get("context")])
    (kr / "features.yaml").write_text(yaml.safe_dump(shared))
    tiny = dest / "models" / "tiny.yaml"
    preset = yaml.safe_load(tiny.read_text())
    preset["train"].update(max_steps=15, dense_prior=yaml.safe_load((kr / "models" / "small.yaml").read_text())
                           ["train"]["dense_prior"])
    tiny.write_text(yaml.safe_dump(preset))
    quality = yaml.safe_load((dest / "quality.yaml").read_text())
    quality["model_gate"].update(min_positives=5, max_ne=50.0, max_vs_labels_only=50.0)  # only has to run
    (dest / "quality.yaml").write_text(yaml.safe_dump(quality))
    return dest


@pytest.mark.timeout(600)
def test_kuairand_slice_runs_the_whole_graph(tmp_path: Path) -> None:
    rows = _slice(need("kuairand_pure"), tmp_path / "kuairand")
    home = tmp_path / "gem"
    run_demo_slice("kuairand", tmp_path / "kuairand", _assets(tmp_path / "assets"), home)

    # the window came from the data; every row accounted for, recounted from the lake
    assert yaml.safe_load((home / "imports" / "kuairand" / "calendar.yaml").read_text())["start"] == "2022-04-30"
    acc = json.loads((home / "reports" / "source_accounting.json").read_text())
    assert acc["all_accounted"]
    (f,) = acc["files"]
    assert f["read"] == rows and f["imported"] + f["quarantined"] == rows
    assert f["reasons"]["duplicate_record"] == f["exact_duplicates"] > 0 and f["time_clamped"] > 0
    events = pl.read_delta(str(home / "lake" / "events"))
    assert set(events["surface"]) == {"tab_1", "tab_0", "tab_4", "tab_6", "tab_2"}
    assert events["conversion"].is_not_null().all()  # long_view in the conversion slot
    # the side tables' context columns, typed, after the unified schema in events and training_examples
    examples = pl.read_delta(str(home / "lake" / "training_examples"))
    for df in (events, examples):
        assert df.schema["follow_user_num"] == pl.Float64 and df.schema["video_type"] == pl.String
        assert df["video_type"].null_count() < df.height and df["follow_user_num"].null_count() < df.height
    assert events.columns[-10:] == examples.columns[-10:] and "music_type" in events.columns[-10:]

    # two domains of several tabs each: the hierarchical path runs (domain models and their students)
    report = json.loads((home / "reports" / "real_data_report.json").read_text())
    assert not any(str(v).startswith("not applicable") for v in report["hierarchical"].values())
    dist = json.loads((home / "reports" / "distillation_report.json").read_text())["rows"]
    hier = [r for r in dist if r["path"] == "hierarchical" and r["split"] == "evaluation"]
    assert {r["surface"] for r in hier if r["ne"] is not None} == {"tab_1", "tab_0", "tab_4", "tab_6", "tab_2"}
    assert (home / "models" / "domain_models").is_dir()
