"""GEM_DATA: one switch, validated before it becomes a path; the hierarchical path where it applies;
bootstrap intervals for real data (no oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from gem_model.config import (
    ASSETS_DIR,
    SOURCES_DIR,
    ConfigError,
    dataset_name,
    load_features,
    load_surfaces,
    spec_path,
)
from gem_model.distill.run import NOT_APPLICABLE, not_applicable_rows
from gem_model.distill.teacher import path_applies
from gem_model.eval.metrics import bootstrap_ci, normalized_entropy


def test_default_is_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEM_DATA", raising=False)
    assert dataset_name() == "sim"
    assert spec_path("surfaces.yaml") == ASSETS_DIR / "surfaces.yaml"


def test_a_dataset_brings_its_own_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_DATA", "douban")
    assert spec_path("surfaces.yaml") == SOURCES_DIR / "douban" / "surfaces.yaml"
    assert spec_path("quality.yaml") == ASSETS_DIR / "quality.yaml"  # not declared: the shared one
    assert spec_path("features.yaml") == SOURCES_DIR / "douban" / "features.yaml"  # its own table sizes
    assert load_features().tables["item"] > load_features(ASSETS_DIR / "features.yaml").tables["item"]
    assert spec_path("expectations/events.json") == SOURCES_DIR / "douban" / "expectations" / "events.json"
    assert load_surfaces().names == ["music", "book", "movie"]


@pytest.mark.parametrize("name", ["../etc", "Douban", "douban/..", "a b", "nope"])
def test_bad_or_unknown_names_are_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("GEM_DATA", name)
    with pytest.raises(ConfigError, match="GEM_DATA"):
        dataset_name()


def test_hierarchical_path_needs_two_surfaces_in_the_domain() -> None:
    douban = load_surfaces(SOURCES_DIR / "douban" / "surfaces.yaml")
    taobao = load_surfaces(SOURCES_DIR / "taobao" / "surfaces.yaml")
    assert not path_applies("hierarchical", "movie", douban) and path_applies("direct", "movie", douban)
    assert path_applies("hierarchical", "pid_0", taobao)
    rows = not_applicable_rows(["labels_only", "standard_kd"], ["direct", "hierarchical"], douban.names, douban)
    assert {(r["arm"], r["path"], r["surface"], r["split"]) for r in rows} == {
        ("standard_kd", "hierarchical", s, sp) for s in douban.names for sp in ("validation", "evaluation")}
    assert all(r["status"] == NOT_APPLICABLE and r["ne"] is None for r in rows)
    assert not_applicable_rows(["standard_kd"], ["direct", "hierarchical"], taobao.names, taobao) == []


def test_bootstrap_intervals_cover_the_estimate_and_shrink_with_data() -> None:
    rng = np.random.default_rng(0)
    widths = []
    for n in (500, 20000):
        p = rng.uniform(0.05, 0.6, n)
        y = (rng.uniform(size=n) < p).astype(float)
        ci = bootstrap_ci(y, p, n_boot=200, seed=1)
        ne = normalized_entropy(y, p)
        assert ci["ne"][0] < ne < ci["ne"][1]
        assert 0.5 < ci["auc"][0] < ci["auc"][1] < 1.0
        widths.append(ci["ne"][1] - ci["ne"][0])
    assert widths[1] < widths[0] / 3
    assert bootstrap_ci(np.zeros(0), np.zeros(0))["ne"] != bootstrap_ci(np.zeros(0), np.zeros(0))["ne"]  # nan
