"""Metrics against known values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from gem_model.eval.metrics import auc, calibration, entropy, log_loss, metric_rows, normalized_entropy


def test_ne_of_base_rate_is_one():
    y = np.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    assert normalized_entropy(y, np.full(10, 0.2)) == pytest.approx(1.0)
    assert normalized_entropy(y, np.where(y == 1, 0.9, 0.05)) < 0.5
    assert math.isnan(normalized_entropy(np.zeros(5), np.full(5, 0.1)))


def test_log_loss_and_entropy():
    assert log_loss(np.array([1.0]), np.array([0.5])) == pytest.approx(math.log(2))
    assert entropy(0.5) == pytest.approx(math.log(2))
    assert entropy(0.0) == 0.0


def test_auc_known_values():
    y = np.array([0, 0, 1, 1])
    assert auc(y, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(y, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert auc(y, np.full(4, 0.3)) == 0.5
    assert math.isnan(auc(np.ones(3), np.array([0.1, 0.2, 0.3])))


def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    p = rng.integers(0, 5, 60) / 4  # many ties
    pos, neg = p[y == 1], p[y == 0]
    pairs = sum((a > b) + 0.5 * (a == b) for a, b in itertools.product(pos, neg))
    assert auc(y, p) == pytest.approx(pairs / (len(pos) * len(neg)))


def test_calibration():
    y = np.array([1, 0, 0, 0])
    assert calibration(y, np.full(4, 0.25)) == pytest.approx(1.0)
    assert calibration(y, np.full(4, 0.5)) == pytest.approx(2.0)


def test_metric_rows_with_oracle():
    preds = pl.DataFrame(
        {
            "request_id": ["a", "b", "c", "d", "e", "f"],
            "surface": ["feed"] * 4 + ["reels"] * 2,
            "click": [1.0, 0.0, 0.0, 1.0, 0.0, 1.0],
            "conversion": [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            "click_mask": [True] * 6,
            "conversion_mask": [True] * 4 + [False] * 2,
            "p_click": [0.5] * 6,
            "p_conversion": [0.25] * 6,
        }
    )
    oracle = pl.DataFrame(
        {"request_id": list("abcdef"), "p_click": [0.9, 0.1, 0.1, 0.9, 0.2, 0.8], "p_conversion": [0.1] * 4 + [None] * 2}
    )
    rows = {(r["surface"], r["task"]): r for r in metric_rows(preds, oracle)}
    assert set(rows) == {("feed", "click"), ("feed", "conversion"), ("reels", "click")}
    fc = rows[("feed", "click")]
    assert fc["n"] == 4 and fc["positives"] == 2
    assert fc["ne"] == pytest.approx(1.0)
    assert fc["oracle_ne"] < fc["ne"]
    assert fc["gap"] == pytest.approx(fc["ne"] / fc["oracle_ne"] - 1)
    assert metric_rows(preds, None)[0]["oracle_ne"] is None


def test_read_oracle_missing_table(lake, tmp_path):
    """Real logs have no oracle table: `missing_ok` says so with None; without it, or for a table that
    exists, nothing is hidden."""
    from gem_model.eval.metrics import read_oracle

    absent = str(tmp_path / "no_oracle")
    assert read_oracle(["2026-11-05"], uri=absent, missing_ok=True) is None
    with pytest.raises(FileNotFoundError):
        read_oracle(["2026-11-05"], uri=absent)
    rows = read_oracle(["2026-11-05"], ["feed"], uri=str(lake / "oracle"), missing_ok=True)
    assert rows is not None and rows.height > 0
    assert set(rows["surface"].unique()) == {"feed"}
