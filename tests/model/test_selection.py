"""gem_model.train.selection: the one E-1 scoring behind bench/model_search.py and sources.validate, and the
search's scoring of E-1 as served."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math

import polars as pl
import pytest

import gem_model.train.streams as streams_mod
from gem_model.config import REPO_ROOT
from gem_model.distill.teacher import FOUNDATION, predict_teacher
from gem_model.eval.metrics import normalized_entropy
from gem_model.models.registry import load_model
from gem_model.train.selection import score_variant, table_row

pytestmark = pytest.mark.timeout(300)


def test_score_variant_selects_on_the_validation_day_only(lake, monkeypatch) -> None:
    read: list[tuple[str, str]] = []
    real = streams_mod.ExampleStream

    def recording(start, end, *a, **kw):
        read.append((str(start), str(end)))
        return real(start, end, *a, **kw)

    monkeypatch.setattr(streams_mod, "ExampleStream", recording)
    over = {"train": {"max_steps": 4, "eval_every": 2, "patience": 5, "torch_threads": 1},
            "buckets": {"user_id": 512}}
    r = score_variant(over, preset="tiny", window=("2026-11-02", "2026-11-03"), valid="2026-11-04", lake=str(lake))
    # trained on the window, scored on the validation day; the evaluation day 2026-11-05 is never read
    assert set(read) == {("2026-11-02", "2026-11-03"), ("2026-11-04", "2026-11-04")}
    assert [int(s) for s, _ in r["valid_history"]] == [2, 4]
    assert r["score"] == min(sc for _, sc in r["valid_history"]) and math.isfinite(r["score"])
    assert r["best_step"] in (2, 4) and r["steps"] == 4
    assert r["ne"] and all(math.isfinite(v) for v in r["ne"].values())
    # four surfaces: the smaller ones' NE is a positives-weighted mean of some of the per-surface figures
    assert len(r["ne"]) == 4 and min(r["ne"].values()) <= r["smaller"] <= max(r["ne"].values())
    row = table_row("tiny_users", over, r)
    assert row.startswith("| tiny_users | ") and f"{r['score']:.4f}" in row


def test_variant_features_resizes_tables_and_leaves_dense_features_out() -> None:
    from gem_model.config import load_features
    from gem_model.train.selection import variant_features

    base = load_features()
    assert variant_features(base, {"train": {"lr": 0.1}}) is None  # nothing of features.yaml changed
    dense = [f.name for f in base.dense]
    v = variant_features(base, {"buckets": {"user_id": 512}, "drop_dense": dense[:1]})
    assert v is not None and [f.name for f in v.dense] == dense[1:]
    assert next(f.buckets for f in v.sparse if f.name == "user_id") == 512
    assert [f.name for f in base.dense] == dense  # the loaded config is not mutated
    with pytest.raises(ValueError, match="not dense features"):
        variant_features(base, {"drop_dense": ["no_such_feature"]})
    no_device = variant_features(base, {"drop_sparse": ["device"]})
    assert no_device is not None and [f.name for f in no_device.sparse] == [f.name for f in base.sparse if f.name != "device"]
    with pytest.raises(ValueError, match="not sparse features"):
        variant_features(base, {"drop_sparse": ["bid"]})
    added = variant_features(base, {"drop_dense": dense[-1:], "add_dense": [{"name": dense[-1], "transform": "none"}]})
    assert added is not None and [f.name for f in added.dense] == dense
    with pytest.raises(ValueError, match="already"):
        variant_features(base, {"add_dense": [{"name": dense[0], "transform": "none"}]})


def _model_search():
    """bench/model_search.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("model_search", REPO_ROOT / "bench" / "model_search.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_served_row_is_the_validation_day_as_teacher_predictions_serves_it(lake, tmp_path) -> None:
    over = {"train": {"max_steps": 4, "eval_every": 2, "patience": 5, "torch_threads": 1}}
    r = score_variant(over, preset="tiny", window=("2026-11-02", "2026-11-03"), valid="2026-11-04", lake=str(lake),
                      keep=str(tmp_path / "v"))
    row = _model_search().served_row("v", tmp_path / "v", "2026-11-04")
    cells = [c.strip() for c in row.strip("|").split("|")]
    per = {s: float(v) for s, v in (kv.split() for kv in cells[2].split(", "))}
    assert cells[0] == "v" and set(per) == set(r["ne"])
    assert min(per.values()) <= float(cells[1]) <= max(per.values())  # a weighted mean of the surfaces
    # what teacher_predictions would serve for that day (fold-in, map re-fitted), against its labels; a checkpoint's
    # E-1 NE is before its map, as served the map fitted after selection applies
    model, cfg = load_model(tmp_path / "v" / "model.pt")
    day = dt.date(2026, 11, 4)
    pred = predict_teacher(model, [day], FOUNDATION, "v", recalibrate=True, fold_in=cfg)
    clicks = pl.read_delta(str(lake / "training_examples")).filter(pl.col("date") == day).select("request_id", "click")
    df = pred.join(clicks, on="request_id")
    assert df.height == pred.height == clicks.height
    for s, ne in per.items():
        g = df.filter(pl.col("surface") == s)
        assert ne == pytest.approx(normalized_entropy(g["click"].to_numpy(), g["p_click"].to_numpy()), abs=1e-4), s
    assert any(abs(per[s] - r["ne"][s]) > 1e-3 for s in per)


def test_smaller_surfaces_ne_leaves_the_largest_out_and_weighs_by_positives() -> None:
    from gem_model.eval.metrics import smaller_surfaces
    from gem_model.train.selection import smaller_surfaces_ne

    rows = [{"surface": "big", "ne": 0.5, "positives": 900}, {"surface": "a", "ne": 0.9, "positives": 30},
            {"surface": "b", "ne": 0.8, "positives": 10}, {"surface": "none", "ne": 2.0, "positives": 0}]
    assert smaller_surfaces_ne(rows) == pytest.approx((0.9 * 30 + 0.8 * 10) / 40)
    assert smaller_surfaces_ne(rows[:2]) is None  # the rest would be one surface's own figure
    assert [r["surface"] for r in smaller_surfaces(rows)] == ["a", "b"]  # no positives: not a surface of the pool
