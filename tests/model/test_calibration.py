"""Post-hoc calibration (gem_model.models.calibration): the Platt map fixes a miscalibrated model on held-out
rows, is fitted on E-1 only, round-trips through weights_only checkpoints, and keeps the identity
for heads with too few positives."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from gem_model.eval.metrics import calibration, log_loss, predict
from gem_model.models import GEM
from gem_model.models.calibration import Calibrator, fit_calibrator
from gem_model.models.registry import load_model
from tests.model.conftest import DAYS, tiny_config
from tests.model.helpers import make_batch, tiny_model_config

pytestmark = pytest.mark.timeout(300)

SURFACES = ["feed", "shops"]


def _world(n: int, seed: int, scale: dict[str, float], shift: dict[str, float], rate: float = -2.5) -> pl.DataFrame:
    """Rows of two surfaces whose model logit is a distorted true logit: z = scale*true + shift."""
    rng = np.random.default_rng(seed)
    frames = []
    for s in SURFACES:
        true = rng.normal(rate, 1.0, n)
        y = (rng.random(n) < 1 / (1 + np.exp(-true))).astype(np.float64)
        z = scale[s] * true + shift[s]
        p = 1 / (1 + np.exp(-z))
        frames.append(pl.DataFrame({"surface": [s] * n, "click": y, "conversion": np.zeros(n), "click_mask": np.ones(n, bool),
                                    "conversion_mask": np.zeros(n, bool), "p_click": p, "p_conversion": np.zeros(n)}))
    return pl.concat(frames)


def _apply(cal: Calibrator, df: pl.DataFrame) -> np.ndarray:
    idx = torch.tensor([SURFACES.index(s) for s in df["surface"].to_list()])
    p = df["p_click"].to_numpy()
    z = torch.tensor(np.log(p) - np.log1p(-p)).float()
    logits = torch.stack([z, torch.zeros_like(z)], 1)
    return cal.apply_logits(logits, idx)[:, 0].double().numpy()


def test_platt_map_calibrates_held_out_rows_without_raising_log_loss():
    scale, shift = {"feed": 0.6, "shops": 1.4}, {"feed": 0.5, "shops": -0.7}  # over- and under-predicting
    fit = _world(20000, 0, scale, shift)
    held = _world(20000, 1, scale, shift)
    cal = fit_calibrator(fit, SURFACES, min_positives=30)
    assert cal.fitted[:, 0].all()
    p_cal = _apply(cal, held)
    for s in SURFACES:
        m = (held["surface"] == s).to_numpy()
        y, raw = held["click"].to_numpy()[m], held["p_click"].to_numpy()[m]
        assert abs(calibration(y, raw) - 1) > 0.15  # the world is miscalibrated to begin with
        assert abs(calibration(y, p_cal[m]) - 1) < 0.05
        assert log_loss(y, p_cal[m]) < log_loss(y, raw)
        # the map recovers the inverse distortion: a = 1/scale, b = -shift/scale
        i = SURFACES.index(s)
        assert float(cal.a[i, 0]) == pytest.approx(1 / scale[s], rel=0.1)
        assert float(cal.b[i, 0]) == pytest.approx(-shift[s] / scale[s], abs=0.25)


def test_identity_below_the_positive_threshold():
    df = _world(400, 2, {"feed": 0.5, "shops": 0.5}, {"feed": 1.0, "shops": 1.0}, rate=-4.0)  # ~10 positives each
    pos = {s: int(df.filter(pl.col("surface") == s)["click"].sum()) for s in SURFACES}
    cal = fit_calibrator(df, SURFACES, min_positives=max(pos.values()) + 1)
    assert not cal.fitted.any()
    assert torch.equal(cal.a, torch.ones_like(cal.a)) and torch.equal(cal.b, torch.zeros_like(cal.b))
    meta = cal.metadata()["heads"]["feed"]["click"]
    assert meta["positives"] == pos["feed"] and "identity" in meta["why"]
    # one surface above the threshold, the other below
    cal = fit_calibrator(df, SURFACES, min_positives=min(pos.values()) + 1) if pos["feed"] != pos["shops"] else None
    if cal is not None:
        assert int(cal.fitted[:, 0].sum()) == 1


def test_checkpoint_with_calibrator_round_trips_weights_only(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_model_config()
    model = GEM(cfg)
    cal = Calibrator.identity(list(cfg.surfaces))
    cal.a[:, 0], cal.b[:, 0], cal.fitted[:, 0] = 0.5, -1.0, True
    cal.fit_day = "2026-11-06"
    torch.save({"model": model.state_dict(), "model_config": cfg.to_dict(), "config": {},
                "calibration": cal.state()}, tmp_path / "model.pt")
    ck = torch.load(tmp_path / "model.pt", weights_only=True)
    back = Calibrator.from_state(ck["calibration"])
    assert torch.equal(back.a, cal.a) and torch.equal(back.b, cal.b) and back.fit_day == "2026-11-06"
    loaded, _ = load_model(tmp_path / "model.pt")
    batch = make_batch(cfg, [3, 0, 5, 2] * 4)
    out = predict(loaded, [batch])
    raw = out["p_click_raw"].to_numpy()
    z = np.log(raw) - np.log1p(-raw)
    np.testing.assert_allclose(out["p_click"].to_numpy(), 1 / (1 + np.exp(-(0.5 * z - 1.0))), rtol=1e-4)
    # conversion heads were left at the identity
    np.testing.assert_allclose(out["p_conversion"].to_numpy(), out["p_conversion_raw"].to_numpy(), rtol=1e-6)


def _flip_labels(lake, day) -> None:
    """Invert click labels of one day of training_examples (the evaluation day E)."""
    uri = str(lake / "training_examples")
    df = pl.read_delta(uri)
    df = df.with_columns(pl.when(pl.col("date") == day).then(1 - pl.col("click")).otherwise(pl.col("click"))
                         .cast(df["click"].dtype).alias("click"))
    df.write_delta(uri, mode="overwrite", delta_write_options={"partition_by": ["date"]})


def test_calibrator_is_fitted_on_validation_day_only(lake, tmp_path):
    from gem_model.train.loop import train

    def run(name: str) -> tuple[dict, list]:
        cfg = tiny_config(tmp_path / name, max_steps=6, eval_every=3, calibration_min_positives=5)
        summary = train(cfg)
        return torch.load(tmp_path / name / "model.pt", weights_only=True)["calibration"], summary["rows"]

    first, rows_before = run("a")
    _flip_labels(lake, DAYS[4])  # E = 2026-11-05
    second, rows_after = run("b")
    assert first["fit_day"] == "2026-11-04"
    assert bool(first["fitted"].any()) and not torch.allclose(first["a"], torch.ones_like(first["a"]))
    torch.testing.assert_close(first["a"], second["a"])
    torch.testing.assert_close(first["b"], second["b"])
    # E's labels did change what E reports
    pos = {(r["surface"], r["task"]): r["positives"] for r in rows_before}
    assert any(pos[(r["surface"], r["task"])] != r["positives"] for r in rows_after if r["task"] == "click")
    # the raw calibration is reported beside the calibrated one
    assert all(r["calibration_raw"] is not None for r in rows_before)


def test_calibration_interval_reflects_the_click_count_of_the_day():
    """A calibrated model's calibration on a day with ~350 positives moves by about +-2/sqrt(350)
    (the goal's +-5% is about one such sd): the interval says so, and contains the point."""
    from gem_model.eval.metrics import bootstrap_calibration, interval

    rng = np.random.default_rng(4)
    for n, rate in ((20000, 0.0175), (80000, 0.0175)):
        p = np.full(n, rate)
        y = (rng.random(n) < p).astype(np.float64)
        lo, hi = interval(bootstrap_calibration(y, {"m": p}, n_boot=400)["m"])
        assert lo <= calibration(y, p) <= hi
        assert (hi - lo) == pytest.approx(2 * 1.96 / np.sqrt(y.sum()), rel=0.25)
