"""The evaluation world of `make eval` (assets/simulator_eval.yaml): every surface has the click
positives on E that a per-surface confidence interval needs; it is the demo world otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gem_model.config import ConfigError, load_calendar, load_simulator, load_surfaces
from gem_pipelines.data.simulator import simulate_day_frames

MIN_POSITIVES = 300  # issue 9: >= 300 click positives per surface on E


def test_eval_world_has_enough_click_positives_on_every_surface(monkeypatch):
    monkeypatch.setenv("GEM_SIMULATOR", "eval")
    cfg, surfaces = load_simulator(), load_surfaces()
    e_day = load_calendar(days=7).roles().evaluation  # the demo calendar's E (no next-day extension)
    clicks = {s: int(simulate_day_frames(cfg, surfaces, s, e_day)[0]["click"].sum()) for s in surfaces.names}
    assert min(clicks.values()) >= MIN_POSITIVES, clicks


def test_eval_world_is_the_demo_world_with_more_traffic(monkeypatch):
    demo = load_simulator()
    monkeypatch.setenv("GEM_SIMULATOR", "eval")
    ev = load_simulator()
    same = {k for k in demo.model_fields if k not in ("impressions_per_day", "traffic_share")}
    assert {k: getattr(ev, k) for k in same} == {k: getattr(demo, k) for k in same}
    assert ev.impressions_per_day > demo.impressions_per_day
    shops = load_surfaces().get("shops")
    assert ev.share(shops) > demo.share(shops) == shops.traffic_share


def test_traffic_share_override_is_validated(monkeypatch):
    with pytest.raises(ConfigError):
        load_simulator(traffic_share={"feed": 0.5, "shops": 0.2})  # does not sum to 1
    monkeypatch.setenv("GEM_SIMULATOR", "../simulator")
    with pytest.raises(ConfigError):
        load_simulator()


def test_make_eval_state_never_mixes_with_the_demo(monkeypatch, tmp_path):
    """`make eval` builds its world under $GEM_HOME/eval_world (lake, Dagster instance, models) and
    simulates it from simulator_eval.yaml, whatever DAGSTER_HOME the caller had."""
    from gem_model.paths import gem_home, lake_root
    from gem_pipelines.evaluate import use_eval_world

    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("GEM_SIMULATOR", raising=False)
    home = use_eval_world()
    assert home == gem_home() == (tmp_path / "eval_world").resolve()
    assert lake_root() == str(home / "lake")
    assert Path(os.environ["DAGSTER_HOME"]) == home / "dagster"
    assert load_simulator().traffic_share is not None
