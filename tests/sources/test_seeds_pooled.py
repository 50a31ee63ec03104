"""The seeds report's pooled difference over the small surfaces (gem_pipelines.sources.report)."""

from __future__ import annotations

import numpy as np
import pytest

from gem_pipelines.sources.report import pooled_difference, seeds_markdown


def test_pooled_difference_weights_each_resample_by_positives() -> None:
    # three resamples; tab_a has 100 positives, tab_b 300: weights 0.25 / 0.75, draw by draw
    diffs = {"tab_a": np.array([-0.04, 0.00, 0.04]), "tab_b": np.array([-0.02, -0.01, -0.03])}
    p = pooled_difference(diffs, {"tab_a": 0.02, "tab_b": -0.02}, {"tab_a": 100, "tab_b": 300})
    assert p["weights"] == pytest.approx({"tab_a": 0.25, "tab_b": 0.75})
    assert p["diff"] == pytest.approx(0.25 * 0.02 + 0.75 * -0.02)
    pooled_draws = np.array([-0.025, -0.0075, -0.0125])
    assert p["lo"] == pytest.approx(np.quantile(pooled_draws, 0.025))
    assert p["hi"] == pytest.approx(np.quantile(pooled_draws, 0.975))
    assert p["hi"] < 0 and p["verdict"] == "a better"  # every pooled draw below 0
    # a surface whose draws straddle 0 with most of the weight: no difference shown
    q = pooled_difference(diffs, {"tab_a": 0.0, "tab_b": -0.02}, {"tab_a": 900, "tab_b": 100})
    assert q["lo"] < 0 < q["hi"] and q["verdict"] == "no difference shown"
    with pytest.raises(ValueError, match="no surface with positives"):
        pooled_difference({"tab_a": diffs["tab_a"]}, {"tab_a": 0.0}, {"tab_a": 0})


def test_seeds_markdown_prints_the_baselines_and_the_pooled_row() -> None:
    block = {"ne": 0.9, "ne_ci": [0.88, 0.92], "valid_ne": 0.91}
    d = {"diff": -0.01, "lo": -0.02, "hi": -0.001, "verdict": "a better"}
    doc = {"dataset": "kuairand", "evaluation_day": "2022-05-03", "seeds": [0], "n_boot": 3,
           "rows": [{"surface": "tab_0", "positives": 144, "peer_ne": 0.985, "foundation": block,
                     "single_surface": block, "foundation_minus_single": d,
                     "logistic_regression": {"ne": 0.95, "ne_ci": [0.94, 0.96]},
                     "base_rate": {"ne": 1.001, "ne_ci": [0.999, 1.003]}}],
           "pooled": {"surfaces": ["tab_0", "tab_4"], "weights": {"tab_0": 0.2, "tab_4": 0.8}, **d}}
    md = seeds_markdown(doc)
    assert "| 0.950 [0.940, 0.960] | 1.001 [0.999, 1.003] | 0.985 |" in md
    assert "Pooled over the small surfaces (tab_0 0.20, tab_4 0.80" in md
    assert "-0.0100 [-0.0200, -0.0010] (foundation better)" in md


def test_a_trained_run_matches_its_preset_despite_filled_in_defaults() -> None:
    from gem_pipelines.sources.report import _same_setting

    assert _same_setting({"dim": 32}, {"dim": 32, "max_rows": 8192})  # the typed config's default added
    assert not _same_setting({"dim": 32}, {"dim": 16, "max_rows": 8192})
    assert not _same_setting({"dim": 32}, None)
    assert _same_setting(0.0001, 0.0001) and not _same_setting(0.0001, 0.001)


def test_a_run_from_before_a_model_option_ran_its_default() -> None:
    """A preset may name an option at its default (KuaiRand's topic_log_share false, under the simulated worlds'
    true) that the config of a run from before the option does not carry: that run still runs the preset."""
    from gem_pipelines.sources.report import runs_preset

    old_run = {"seed": 1, "model": {"topic_dim": 32}, "train": {"lr": 0.001, "item_svd": {"dim": 32, "max_rows": 8192}}}
    spec = {"model": {"topic_dim": 32, "topic_log_share": False}, "train": {"lr": 0.001, "item_svd": {"dim": 32}}}
    assert runs_preset(spec, old_run, seed=1)
    assert not runs_preset(spec, old_run, seed=0)
    assert not runs_preset({**spec, "model": {"topic_dim": 32, "topic_log_share": True}}, old_run, seed=1)
    assert not runs_preset({**spec, "train": {"lr": 0.01}}, old_run, seed=1)
