"""A small synthetic lake (training_examples + oracle) with a learnable signal, built once per session."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

START = dt.date(2026, 11, 1)
DAYS = [START + dt.timedelta(days=i) for i in range(5)]  # warm-up, teacher d2, students, valid d4, eval d5
ROWS_PER_DAY = 3000


@pytest.fixture(scope="session")
def _lake_template(tmp_path_factory) -> Path:
    from gem_model.data.synthetic import (
        write_synthetic_lake,  # polars: imported only by tests that use a lake
    )

    root = tmp_path_factory.mktemp("lake_template")
    write_synthetic_lake(str(root), DAYS, ROWS_PER_DAY, seed=3)
    return root


@pytest.fixture
def lake(gem_home, _lake_template) -> Path:
    """$GEM_HOME/lake with training_examples and oracle (a copy per test)."""
    dest = gem_home / "lake"
    shutil.copytree(_lake_template, dest)
    return dest


def tiny_config(out_dir: Path, **train_overrides) -> dict:
    return {
        "preset": "tiny",
        "data": {"train": ["2026-11-02", "2026-11-03"], "valid": "2026-11-04", "eval": "2026-11-05"},
        "seed": 0,
        "device": "cpu",
        "out_dir": str(out_dir),
        "train": {"torch_threads": 1, **train_overrides},
    }
