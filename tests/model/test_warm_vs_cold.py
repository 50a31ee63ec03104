"""gem_model.train.warm_vs_cold on the tests' small lake: warm and cold retrains of the same window,
compared on E's rows per surface and pooled, with paired bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from gem_model.train.warm_vs_cold import _versus_lr, markdown, warm_vs_cold

pytestmark = pytest.mark.timeout(600)


def test_warm_vs_cold_trains_both_and_returns_paired_intervals(lake, tmp_path):
    config = {"preset": "tiny", "device": "cpu", "model": {"topic_dim": 4},
              "train": {"torch_threads": 1, "max_steps": 4, "item_svd": {"dim": 4}}}
    result = warm_vs_cold(config, old_train=("2026-11-02", "2026-11-02"), old_valid="2026-11-03",
                          new_train=("2026-11-02", "2026-11-03"), new_valid="2026-11-04", evaluation="2026-11-05",
                          seeds=[0, 1], out_root=tmp_path / "wvc", n_boot=200, lr=True)
    assert [r["warm_start"]["loaded"] > 0 for r in result["runs"]] == [True, True]
    surfaces = result["surfaces"]
    assert "all" in surfaces and len(surfaces) >= 3
    assert surfaces["all"]["n"] == sum(r["n"] for s, r in surfaces.items() if s != "all")
    for r in surfaces.values():
        assert r["diff"] == pytest.approx(r["warm_ne"] - r["cold_ne"])
        assert r["lo"] <= r["diff"] <= r["hi"] and all(math.isfinite(r[k]) for k in ("lo", "hi", "warm_ne", "cold_ne"))
        assert r["verdict"] == ("a better" if r["hi"] < 0 else "b better" if r["lo"] > 0 else "no difference shown")
        assert 0 < r["oracle_ne"] < 1 and r["warm_gap_closed"] is not None  # the synthetic lake has an oracle
    assert min(result["seconds"].values()) > 0 and set(result["seconds"]) == {"old", "warm", "cold", "lr"}
    new = result["new_ads"]  # the warm retrain against the LR on E's ads first seen on E
    assert set(new) == set(surfaces) and new["all"]["n"] == sum(r["n"] for s, r in new.items() if s != "all")
    assert "| all |" in markdown(result) and "first seen on E" in markdown(result)
    # seeds trained apart, compared together: the same figures from the saved models, nothing trained
    again = warm_vs_cold(config, old_train=("2026-11-02", "2026-11-02"), old_valid=None, new_train=("2026-11-02", "2026-11-03"),
                         new_valid="2026-11-04", evaluation="2026-11-05", seeds=[0, 1], out_root=tmp_path / "wvc",
                         n_boot=200, lr=True, compare_only=True)
    assert again["surfaces"] == surfaces and again["new_ads"] == new and again["runs"] == []
    assert set(again["seconds"].values()) == {0.0}
    # from one given old model (the ACCEPTED version, as the weekly retrain): no old training per seed
    again = warm_vs_cold(config, old_train=("2026-11-02", "2026-11-02"), old_valid=None, new_train=("2026-11-02", "2026-11-03"),
                         new_valid="2026-11-04", evaluation="2026-11-05", seeds=[3], out_root=tmp_path / "acc",
                         n_boot=50, init_from=tmp_path / "wvc" / "s0" / "old")
    assert again["runs"][0]["warm_start"]["loaded"] > 0 and again["seconds"]["old"] == 0
    assert sorted(p.name for p in (tmp_path / "acc" / "s3").iterdir()) == ["cold", "warm"]


def test_versus_lr_names_the_better_model_on_new_ads():
    """A model that knows the labels against a constant one: warm better, with intervals around each NE."""
    rng = np.random.default_rng(0)
    y = (rng.random(4000) < 0.1).astype(float)
    sharp = np.where(y == 1, 0.6, 0.05)
    sub = pl.DataFrame({"click": y, "warm|0": sharp, "warm|1": sharp, "lr|0": np.full(4000, 0.1), "lr|1": np.full(4000, 0.1)})
    r = _versus_lr(sub, [0, 1], 200)
    assert r["verdict"] == "a better" and r["diff"] < 0 and r["hi"] < 0
    assert r["warm_ci"][0] <= r["warm_ne"] <= r["warm_ci"][1] and r["lr_ne"] == pytest.approx(1.0, abs=0.01)
    assert _versus_lr(sub.filter(pl.col("click") == 0), [0, 1], 50)["warm_ne"] is None  # no click: nothing to judge
