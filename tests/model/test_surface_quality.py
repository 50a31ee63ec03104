"""gem_model.eval.model_quality.surface_quality: the per-surface table of `make eval`, on rows whose true
click probabilities are known."""

from __future__ import annotations

import numpy as np
import pytest

from gem_model.eval.model_quality import quality_markdown, surface_quality

SEEDS = [0, 1]


def _world(n: int = 20_000):
    rng = np.random.default_rng(0)
    z = rng.normal(-3.5, 1.0, n)
    truth = 1 / (1 + np.exp(-z))
    y = (rng.random(n) < truth).astype(np.float64)
    half = 1 / (1 + np.exp(-(0.5 * z - 1.6)))  # keeps some of the ranking: part of the gap
    preds = {"perfect": truth, "scaled": np.clip(1.1 * truth, 0, 1), "half": half, "flat": np.full(n, y.mean())}
    cols = {f"{m}|{s}": p for m, p in preds.items() for s in SEEDS}
    return y, truth, cols


def test_gap_closed_and_its_interval_against_the_oracle_on_the_same_resamples() -> None:
    y, truth, cols = _world()
    q = surface_quality(y, truth, cols, cols, SEEDS, models=("perfect", "half", "flat"), n_boot=200)
    perfect, half, flat = (q["models"][m] for m in ("perfect", "half", "flat"))
    assert perfect["gap_closed"] == pytest.approx(1.0)
    # the oracle's NE is resampled with the model's: a perfect model's gap is 1 on every resample
    assert perfect["gap_closed_lo"] == pytest.approx(1.0) and perfect["gap_closed_hi"] == pytest.approx(1.0)
    assert flat["gap_closed"] == pytest.approx(0.0, abs=1e-9)
    assert half["gap_closed_lo"] < half["gap_closed"] < half["gap_closed_hi"]
    assert 0.05 < half["gap_closed"] < 0.95
    assert q["foundation_minus"]["flat"]["verdict"] == "a better"
    assert q["goal_ne"] == pytest.approx(1 - 0.6 * (1 - q["oracle_ne"]))


def test_calibration_against_the_truth_leaves_the_click_count_out() -> None:
    y, truth, cols = _world()
    q = surface_quality(y, truth, cols, cols, SEEDS, models=("perfect", "scaled"), n_boot=100)
    # E's clicks put even the true probabilities off 1.0 by their own count; against the truth they are 1
    assert q["models"]["perfect"]["calibration"] == pytest.approx(q["oracle_calibration"])
    assert q["models"]["perfect"]["calibration_truth"] == pytest.approx(1.0)
    assert q["models"]["scaled"]["calibration_truth"] == pytest.approx(1.1, rel=1e-3)
    lo, hi = q["models"]["perfect"]["calibration_lo"], q["models"]["perfect"]["calibration_hi"]
    assert lo < q["oracle_calibration"] < hi


def test_the_markdown_shows_the_gap_interval_and_the_truth_column() -> None:
    y, truth, cols = _world(5_000)
    q = surface_quality(y, truth, cols, cols, SEEDS, models=("half", "flat"), n_boot=50)
    q["models"] = {"foundation": q["models"]["half"]}  # the markdown's first model is the foundation
    q["foundation_minus"] = {}
    md = quality_markdown({"surfaces": {"feed": {**q, "oracle_calibration_valid": None}}, "n_boot": 50}, 2, 60.0)
    row = next(line for line in md.splitlines() if line.startswith("| feed | ") and "foundation" in line)
    gap = q["models"]["foundation"]
    assert f"{100 * gap['gap_closed']:.0f}% [{100 * gap['gap_closed_lo']:.0f}%, {100 * gap['gap_closed_hi']:.0f}%]" in row
    assert f"| {gap['calibration_truth']:.3f} |" in row
    assert "calibration vs truth" in md
