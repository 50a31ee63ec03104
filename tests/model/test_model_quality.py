"""The model reads the history: on a synthetic world where the click depends on the history only,
GEM beats the same model trained on the same rows with histories emptied, and beats the
logistic-regression baseline; dense normalisation uses the training window's statistics."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gem_model.config import load_features
from gem_model.data.loader import ExampleStream
from gem_model.data.normalization import dense_stats
from gem_model.data.synthetic import write_synthetic_lake
from gem_model.eval.baselines import run_baselines
from gem_model.train.loop import train

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

DAYS = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(5)]
TRAIN, VALID, EVAL = ["2026-11-01", "2026-11-03"], "2026-11-04", "2026-11-05"
ROWS = 4000
WORLD = {"n_users": 400, "n_ads": 48, "n_items": 192, "n_topics": 6, "max_hist": 16}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, empty in (("history", False), ("emptied", True)):
        root = tmp_path_factory.mktemp(f"world_{name}")
        write_synthetic_lake(str(root), DAYS, ROWS, seed=5, history_only=True, empty_history=empty, **WORLD)
        out[name] = root
    return out


def _config(lake: Path, out: Path) -> dict:
    return {
        "preset": "tiny",
        "data": {"train": TRAIN, "valid": VALID, "eval": EVAL, "lake": str(lake)},
        "seed": 0, "device": "cpu", "out_dir": str(out),
        "train": {"torch_threads": 1, "epochs": 4, "eval_every": 40, "patience": 3, "lr": 0.01, "emb_lr": 0.01},
    }


def _click_ne(rows: list[dict]) -> float:
    rows = [r for r in rows if r["task"] == "click" and math.isfinite(r["ne"])]
    return float(np.average([r["ne"] for r in rows], weights=[r["positives"] for r in rows]))


@pytest.fixture(scope="module")
def runs(worlds, tmp_path_factory) -> dict[str, dict]:
    mp = pytest.MonkeyPatch()
    mp.setenv("GEM_HOME", str(tmp_path_factory.mktemp("home")))
    try:
        out = {name: train(_config(lake, tmp_path_factory.mktemp(f"run_{name}"))) for name, lake in worlds.items()}
        lake = worlds["history"]
        out["baselines"] = run_baselines(
            [str(d) for d in DAYS[:3]], VALID, EVAL, tmp_path_factory.mktemp("baselines"),
            uri=f"{lake}/training_examples", oracle_uri=f"{lake}/oracle", epochs=4,
        )
    finally:
        mp.undo()
    return out


def test_model_with_histories_beats_emptied_histories(runs):
    with_h, without = _click_ne(runs["history"]["rows"]), _click_ne(runs["emptied"]["rows"])
    assert with_h < without - 0.03, (with_h, without)


def test_model_beats_logistic_regression(runs):
    gem = _click_ne(runs["history"]["rows"])
    lr = _click_ne(runs["baselines"]["logistic_regression"])
    base = _click_ne(runs["baselines"]["base_rate"])
    assert abs(base - 1.0) < 0.05  # the base rate is the base rate
    assert lr < base  # the baseline learns something (it is not a strawman)...
    assert gem < lr - 0.01, (gem, lr)  # ... and the model reads the history better


def test_the_logistic_regression_is_scored_behind_its_own_map(runs):
    """The post-hoc map every model of the protocol gets, fitted on the days after the LR's window up to E-1
    (never E): E's predictions carry the raw column and the mapped one."""
    from gem_model.models.calibration import calibration_days

    base = runs["baselines"]
    assert base["_lr_calibration"]["fit_day"] == ",".join(calibration_days(DAYS[2], VALID)) == VALID
    assert any(h["click"]["fitted"] for h in base["_lr_calibration"]["heads"].values())
    for r in base["logistic_regression"]:
        assert r["ne_raw"] is not None and r["calibration_raw"] is not None
    moved = [r for r in base["logistic_regression"] if r["calibration"] != pytest.approx(r["calibration_raw"])]
    assert moved, "the map changed no surface's level"


def test_normalisation_statistics_are_the_training_windows(runs, worlds):
    ck = torch.load(Path(runs["history"]["out_dir"]) / "model.pt", map_location="cpu", weights_only=True)
    mean, std = ck["model"]["dense_mean"], ck["model"]["dense_std"]
    # the same statistics, recomputed from the Encoder's own tensors over the training window
    stream = ExampleStream(TRAIN[0], TRAIN[1], shuffle=False, uri=f"{worlds['history']}/training_examples",
                           storage_options={})
    x = torch.cat([b.dense for b in stream]).double()
    torch.testing.assert_close(mean.double(), x.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(std.double(), x.std(0, unbiased=False), rtol=1e-3, atol=1e-4)
    # ... and not the evaluation day's (tenure differs day to day: other users are active)
    e_mean, _ = dense_stats(f"{worlds['history']}/training_examples", [dt.date.fromisoformat(EVAL)], None,
                            load_features())
    assert not torch.allclose(mean.double(), torch.tensor(e_mean, dtype=torch.float64), atol=1e-6)
