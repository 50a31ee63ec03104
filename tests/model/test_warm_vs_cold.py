"""gem_model.train.warm_vs_cold on the tests' small lake: warm and cold retrains of the same window,
compared on E's rows per surface and pooled, with paired bootstrap intervals."""

from __future__ import annotations

import math

import pytest

from gem_model.train.warm_vs_cold import markdown, warm_vs_cold

pytestmark = pytest.mark.timeout(600)


def test_warm_vs_cold_trains_both_and_returns_paired_intervals(lake, tmp_path):
    config = {"preset": "tiny", "device": "cpu", "model": {"topic_dim": 4},
              "train": {"torch_threads": 1, "max_steps": 4, "item_svd": {"dim": 4}}}
    result = warm_vs_cold(config, old_train=("2026-11-02", "2026-11-02"), old_valid="2026-11-03",
                          new_train=("2026-11-02", "2026-11-03"), new_valid="2026-11-04", evaluation="2026-11-05",
                          seeds=[0, 1], out_root=tmp_path / "wvc", n_boot=200)
    assert [r["warm_start"]["loaded"] > 0 for r in result["runs"]] == [True, True]
    surfaces = result["surfaces"]
    assert "all" in surfaces and len(surfaces) >= 3
    assert surfaces["all"]["n"] == sum(r["n"] for s, r in surfaces.items() if s != "all")
    for r in surfaces.values():
        assert r["diff"] == pytest.approx(r["warm_ne"] - r["cold_ne"])
        assert r["lo"] <= r["hi"] and all(math.isfinite(r[k]) for k in ("lo", "hi", "warm_ne", "cold_ne"))
        assert r["verdict"] in ("a better", "b better", "no difference shown")
        assert 0 < r["oracle_ne"] < 1 and r["warm_gap_closed"] is not None  # the synthetic lake has an oracle
    assert min(result["seconds"].values()) > 0
    assert "| all |" in markdown(result)
