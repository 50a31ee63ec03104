"""A dataset's own model adjustments (assets/sources/<dataset>/models/<preset>.yaml) and the
base-rate start of the heads that real click rates need."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import polars as pl
import pytest
import yaml

from gem_model.config import ASSETS_DIR, SOURCES_DIR, load_features, load_surfaces
from gem_model.models import GEM, GEMConfig
from gem_model.normalization import base_rates
from gem_model.train import load_preset, set_head_bias


def test_dataset_preset_layers_on_the_named_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = yaml.safe_load((ASSETS_DIR / "models" / "small.yaml").read_text())
    own = yaml.safe_load((SOURCES_DIR / "douban" / "models" / "small.yaml").read_text())
    monkeypatch.delenv("GEM_DATA", raising=False)
    assert load_preset("small") == {"model": plain["model"], "train": plain["train"]}
    monkeypatch.setenv("GEM_DATA", "douban")
    got = load_preset("small")
    assert got["model"] == plain["model"]
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
