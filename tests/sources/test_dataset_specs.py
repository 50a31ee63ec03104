"""A dataset's own model adjustments (assets/sources/<dataset>/models/<preset>.yaml) and the
base-rate start of the heads that real click rates need."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import polars as pl
import pytest
import yaml

from gem_model.config import ASSETS_DIR, SOURCES_DIR, load_features, load_surfaces
from gem_model.data.normalization import base_rates
from gem_model.models import GEM, GEMConfig
from gem_model.train.config import load_preset
from gem_model.train.startup import set_head_bias


def test_dataset_preset_layers_on_the_named_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = yaml.safe_load((ASSETS_DIR / "models" / "small.yaml").read_text())
    own = yaml.safe_load((SOURCES_DIR / "douban" / "models" / "small.yaml").read_text())
    monkeypatch.delenv("GEM_DATA", raising=False)
    assert load_preset("small") == {"model": plain["model"], "train": plain["train"]}
    monkeypatch.setenv("GEM_DATA", "douban")
    got = load_preset("small")
    assert got["model"] == {**plain["model"], **own["model"]} != plain["model"]  # key by key, the rest kept
    assert got["train"] == {**plain["train"], **own["train"]} != plain["train"]
    assert load_preset("tiny") == load_preset(ASSETS_DIR / "models" / "tiny.yaml")  # no douban tiny.yaml


def test_heads_start_at_the_training_window_rate(tmp_path: Path) -> None:
    day = dt.date(2026, 11, 2)
    rows = pl.DataFrame({
        "date": [day] * 5 + [day + dt.timedelta(days=1)],
        "surface": ["music", "music", "music", "music", "book", "music"],
        "click": [1, 1, 1, 0, 0, 0],
        "conversion": [None, None, None, None, None, 1],
    })  # fmt: skip
    rows.write_delta(str(tmp_path / "t"))
    rates = base_rates(str(tmp_path / "t"), [day], None)
    assert rates == {"music": {"click": 0.75}, "book": {"click": 0.0}}  # no conversion label: left out
    surfaces = load_surfaces(SOURCES_DIR / "douban" / "surfaces.yaml")
    model = GEM(GEMConfig.from_specs(load_preset("tiny")["model"], features=load_features(ASSETS_DIR / "features.yaml"),
                                     surfaces=surfaces))
    before = {s: model.head_b[s].detach().clone() for s in surfaces.names}
    set_head_bias(model, rates)
    assert model.head_b["music"][0].item() == pytest.approx(math.log(3))
    assert model.head_b["book"][0].item() == pytest.approx(math.log(1e-4 / (1 - 1e-4)), rel=1e-4)  # clamped
    assert model.head_b["music"][1].item() == before["music"][1].item()  # conversion untouched
    assert model.head_b["movie"].tolist() == before["movie"].tolist()  # a surface absent from the window


def test_seeds_report_averages_seeds_with_intervals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """reports/real_data_seeds: per surface, the seed mean of click NE on E with a bootstrap interval of
    that mean and the paired foundation - single-surface difference (predictions written by hand)."""
    import numpy as np

    from gem_model.eval.metrics import normalized_entropy
    from gem_model.store.paths import models_dir
    from gem_pipelines.sources.report import BASELINE, FOUNDATION, PREDICTIONS, seeds_markdown, seeds_report

    monkeypatch.setenv("GEM_DATA", "douban")
    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    rng = np.random.default_rng(0)
    surfaces = ["music", "book", "movie"]
    n = 400
    y = {s: (rng.random(n) < 0.7).astype(int) for s in surfaces}
    versions = {}
    for seed in (0, 1, 2):
        v = f"v{seed}"
        versions[seed] = v
        good = [pl.DataFrame({"request_id": [f"{s}:{i}" for i in range(n)], "surface": s, "click": y[s],
                              "p_click": np.where(y[s] == 1, 0.8, 0.5) + rng.normal(0, 0.01, n)}) for s in surfaces]
        path = models_dir(FOUNDATION, home=tmp_path) / v / PREDICTIONS
        path.parent.mkdir(parents=True)
        pl.concat(good).write_parquet(path)
        valid = [{"surface": s, "task": "click", "ne": 0.80 + seed / 100} for s in surfaces]  # E-1, from training
        (path.parent / "metrics.json").write_text(json.dumps({"valid_rows": valid}))
        for s, g in zip(surfaces, good, strict=True):  # the baseline predicts the base rate
            b = models_dir(BASELINE, s, home=tmp_path) / v / PREDICTIONS
            b.parent.mkdir(parents=True)
            g.with_columns(p_click=pl.lit(0.7)).write_parquet(b)
            (b.parent / "metrics.json").write_text(json.dumps({"valid_rows": [{"surface": s, "task": "click", "ne": 0.9}]}))
    doc = seeds_report("douban", versions, n_boot=200)
    assert doc["seeds"] == [0, 1, 2] and {r["surface"] for r in doc["rows"]} == set(surfaces)
    for r in doc["rows"]:
        f, b = r["foundation"], r["single_surface"]
        assert len(f["per_seed"]) == 3 and f["ne"] == pytest.approx(np.mean(f["per_seed"]))
        assert f["ne_ci"][0] <= f["ne"] <= f["ne_ci"][1]
        assert b["ne"] == pytest.approx(normalized_entropy(y[r["surface"]], np.full(n, 0.7)))
        assert r["foundation_minus_single"]["verdict"] == "a better" and r["positives"] == int(y[r["surface"]].sum())
        assert f["valid_ne"] == pytest.approx(0.81) and b["valid_ne"] == pytest.approx(0.9)  # seed means on E-1
    assert "| movie |" in seeds_markdown(doc) and "foundation better" in seeds_markdown(doc)
    assert "| 0.8100 / 0.9000 |" in seeds_markdown(doc)


def test_dataset_students_preset_layers_on_the_shared_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_model.distill.config import load_student_preset

    own = yaml.safe_load((SOURCES_DIR / "douban" / "models" / "students.yaml").read_text())["presets"]["small"]
    monkeypatch.delenv("GEM_DATA", raising=False)
    plain = load_student_preset("small")
    monkeypatch.setenv("GEM_DATA", "douban")
    got = load_student_preset("small")
    assert got["train"] == {**plain["train"], **own["train"]} != plain["train"]
    assert {k: got[k] for k in ("student", "adapter", "domain")} == {k: plain[k] for k in ("student", "adapter", "domain")}
    assert load_student_preset("tiny") == load_student_preset("tiny", ASSETS_DIR / "models" / "students.yaml")
