"""A small world for the end-to-end tests: a 5-day window, few impressions, the tiny model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from gem_model.config import ASSETS_DIR


def small_assets(dest: Path, *, days: int = 5, impressions: int = 2500) -> Path:
    """A copy of assets/ with a shorter calendar and a smaller simulator, for tests."""
    shutil.copytree(ASSETS_DIR, dest)
    cal = yaml.safe_load((dest / "calendar.yaml").read_text())
    cal["days"] = days
    (dest / "calendar.yaml").write_text(yaml.safe_dump(cal))
    sim = yaml.safe_load((dest / "simulator.yaml").read_text())
    sim.update(impressions_per_day=impressions, n_users=1500)
    (dest / "simulator.yaml").write_text(yaml.safe_dump(sim))
    # The gate's logic has its own tests; here a tiny model on a tiny world only has to be sane.
    quality = yaml.safe_load((dest / "quality.yaml").read_text())
    quality["model_gate"].update(min_positives=5, max_ne=2.0, max_vs_labels_only=0.5)
    (dest / "quality.yaml").write_text(yaml.safe_dump(quality))
    return dest


@pytest.fixture
def e2e_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "gem"
    env = {
        **os.environ,
        "GEM_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "GEM_ASSETS_DIR": str(small_assets(tmp_path / "assets")),
        "GEM_MODEL_PRESET": "tiny",
        "WANDB_MODE": "disabled",
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    env.pop("GEM_LAKE_URI", None)
    return env
