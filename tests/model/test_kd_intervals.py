"""Paired bootstrap intervals of the KD gains on E (gem_model.distill.kd_intervals), on synthetic
predictions: they contain the point estimate, shrink with more rows, and fall back to the two gains
when standard KD's own gain interval does not lie above 0."""

from __future__ import annotations

import numpy as np
import pytest

from gem_model.distill.kd_intervals import (
    RATIO,
    TWO_GAINS,
    EvalPredictions,
    intervals_from_rows,
    intervals_markdown,
    kd_intervals,
    surface_intervals,
)
from gem_model.eval.metrics import normalized_entropy

SEEDS = (0, 1, 2)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _grid(n: int, seed: int = 0, standard_weight: float = 0.6) -> tuple[np.ndarray, dict]:
    """Labels from a true logit; each arm predicts a mix of the true logit and noise (more of the
    truth: lower NE). labels_only 0.3, standard_kd `standard_weight`, parameter_sharing 0.9."""
    rng = np.random.default_rng(seed)
    true = rng.normal(-2.0, 1.2, n)
    y = (rng.random(n) < _sigmoid(true)).astype(np.float64)
    noise = rng.normal(0, 1.2, n)
    weights = {("labels_only", "none"): 0.3, ("standard_kd", "hierarchical"): standard_weight,
               ("parameter_sharing", "hierarchical"): 0.9}
    preds = {}
    for (arm, path), w in weights.items():
        for s in SEEDS:
            jitter = np.random.default_rng(100 * s + len(arm)).normal(0, 0.05, n)
            preds[(arm, path, s)] = _sigmoid(w * true + (1 - w) * (noise - 2.0) + jitter)
    return y, preds


def _point_gain(y, preds, arm, path) -> float:
    ne = lambda a, p: np.mean([normalized_entropy(y, preds[(a, p, s)]) for s in SEEDS])  # noqa: E731
    return ne("labels_only", "none") - ne(arm, path)


def test_intervals_contain_the_point_estimate_and_shrink_with_more_rows():
    widths = {}
    for n in (2000, 20000):
        y, preds = _grid(n)
        out = surface_intervals(y, preds, n_boot=300)
        full = out["arms"]["parameter_sharing|hierarchical"]
        std = out["arms"]["standard_kd|hierarchical"]
        for cell, arm in ((full, "parameter_sharing"), (std, "standard_kd")):
            assert cell["gain"] == pytest.approx(_point_gain(y, preds, arm, "hierarchical"))
            assert cell["gain_lo"] <= cell["gain"] <= cell["gain_hi"]
        assert full["report"] == RATIO
        assert full["effectiveness"] == pytest.approx(full["gain"] / std["gain"])
        assert full["effectiveness_lo"] <= full["effectiveness"] <= full["effectiveness_hi"]
        widths[n] = (full["gain_hi"] - full["gain_lo"], full["effectiveness_hi"] - full["effectiveness_lo"])
    assert widths[20000][0] < 0.6 * widths[2000][0]
    assert widths[20000][1] < 0.6 * widths[2000][1]


def test_two_gains_instead_of_a_ratio_when_standard_kd_gain_interval_includes_zero():
    y, preds = _grid(3000, standard_weight=0.3)  # standard KD = labels-only up to seed jitter
    out = surface_intervals(y, preds, n_boot=300)
    std = out["arms"]["standard_kd|hierarchical"]
    assert std["gain_lo"] <= 0 <= std["gain_hi"]
    full = out["arms"]["parameter_sharing|hierarchical"]
    assert full["report"] == TWO_GAINS and full["effectiveness"] is None
    assert full["gain_lo"] > 0  # the full recipe's own gain is still shown, with its interval
    assert full["standard_gain"] == pytest.approx(std["gain"])


def test_rows_carry_the_intervals_and_the_report_table_shows_them():
    kept = EvalPredictions()
    rows = []
    for surface, weight in (("feed", 0.6), ("shops", 0.3)):
        y, preds = _grid(3000, seed=len(surface), standard_weight=weight)
        ids = np.array([f"{surface}{i}" for i in range(len(y))])
        for (arm, path, s), p in preds.items():
            kept.add(surface, arm, path, s, ids, y, p)
            rows.append({"arm": arm, "path": path, "surface": surface, "split": "evaluation", "task": "click",
                         "seed": s, "ne": normalized_entropy(y, p), "kd_effectiveness": 1.23,
                         "kd_gain_standard": _point_gain(y, preds, "standard_kd", "hierarchical")})
    out = kd_intervals(rows, kept, n_boot=200)
    feed = [r for r in rows if r["surface"] == "feed" and r["arm"] == "parameter_sharing"]
    shops = [r for r in rows if r["surface"] == "shops" and r["arm"] == "parameter_sharing"]
    assert all(r["kd_report"] == RATIO and r["kd_gain_lo"] <= r["kd_gain"] <= r["kd_gain_hi"] for r in feed)
    assert all(r["kd_report"] == TWO_GAINS and r["kd_effectiveness"] is None for r in shops)
    back = intervals_from_rows(rows)
    for s in ("feed", "shops"):
        assert back[s]["arms"]["parameter_sharing|hierarchical"]["gain_lo"] == pytest.approx(
            out[s]["arms"]["parameter_sharing|hierarchical"]["gain_lo"])
    md = intervals_markdown(back)
    assert "two gains" in md and "| feed | **parameter_sharing** | hierarchical |" in md
    with pytest.raises(ValueError, match="other rows"):
        kept.add("feed", "aux_head", "direct", 0, np.array(["x"] * 3000), y, preds[("labels_only", "none", 0)])
