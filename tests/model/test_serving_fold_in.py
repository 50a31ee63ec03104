"""gem_model.distill.serving_fold_in: the fold status of an ad read from the logs against the model's
window, and the per-status logit shift fitted on the map's days (the day's own new ads cannot be folded:
one map per surface left them at 0.73 of their rate on the evaluation world's week)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from gem_model.distill.serving_fold_in import SHIFT_MIN_POSITIVES, fold_status, status_shifts, with_shifts


def test_status_shifts_bring_each_status_to_its_click_rate_and_leave_thin_ones_alone():
    rng = np.random.default_rng(0)
    n = 20000
    status = rng.choice(["known", "folded", "unseen"], n)
    truth = np.where(status == "unseen", 0.04, 0.02)
    y = (rng.random(n) < truth).astype(float)
    p = np.where(status == "unseen", 0.02, np.where(status == "folded", 0.03, 0.02))  # unseen under, folded over
    rows = pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "click": y, "p_click": p, "fold_status": status})
    shifts = status_shifts(rows)
    assert shifts["unseen"] > 0.5 and shifts["folded"] < -0.2 and abs(shifts["known"]) < 0.15
    out = with_shifts(rows.select("request_id", "p_click"), rows.select("request_id", "fold_status"), shifts)
    assert out.columns == ["request_id", "p_click"] and out.height == n
    for s in ("known", "folded", "unseen"):
        m = status == s
        assert out["p_click"].to_numpy()[m].mean() == pytest.approx(y[m].mean(), rel=1e-6)
    # a status with too few clicks is not fitted; a row without a status keeps its prediction
    unseen = rows.filter(pl.col("fold_status") == "unseen")
    few = pl.concat([unseen.filter(pl.col("click") == 0), unseen.filter(pl.col("click") == 1).head(SHIFT_MIN_POSITIVES - 1)])
    assert set(status_shifts(pl.concat([few, rows.filter(pl.col("fold_status") != "unseen")]))) == {"known", "folded"}
    kept = with_shifts(rows.select("request_id", "p_click"), rows.head(10).select("request_id", "fold_status"), shifts)
    assert np.allclose(kept["p_click"].to_numpy()[10:], p[10:])


def test_fold_status_reads_the_first_day_each_ad_is_logged(tmp_path):
    d = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(4)]
    # ad 1 logged from d0 (in the window), ad 2 first on d2 (after it), ad 3 first on d3 (the scored day)
    ex = pl.DataFrame({"request_id": ["a", "b", "c", "d", "e", "f"], "date": [d[0], d[2], d[3], d[3], d[3], d[1]],
                       "ad_id": [1, 2, 1, 2, 3, 1], "hour_of_day": [0, 23, 5, 5, 5, 5]})
    ex.write_delta(str(tmp_path / "training_examples"))
    got = fold_status({"data": {"train": [str(d[0]), str(d[1])]}}, [d[3]], str(tmp_path / "training_examples"))
    assert dict(got.iter_rows()) == {"c": "known", "d": "folded", "e": "unseen"}
    # several days in one scan: each row against its own day (ad 2 is unseen on d2, folded on d3)
    got = fold_status({"data": {"train": [str(d[0]), str(d[1])]}}, [d[2], d[3]], str(tmp_path / "training_examples"))
    assert dict(got.iter_rows()) == {"b": "unseen", "c": "known", "d": "folded", "e": "unseen"}


def test_fold_status_in_slices_counts_the_hours_of_the_day_served_before_the_row(tmp_path):
    """serve_slices 4: a row of hour h is served in the slice starting at 6 * (h // 6); an ad first logged on
    the day before that slice was folded in from the day's own earlier hours, else it is unseen."""
    d = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(3)]
    # ad 3 is born on d2 at hour 4: unseen in its first slice (hours 0-5), folded from hour 6 on
    ex = pl.DataFrame({"request_id": ["a", "b", "c", "d", "e", "f"], "date": [d[0], d[2], d[2], d[2], d[2], d[2]],
                       "ad_id": [1, 1, 3, 3, 3, 3], "hour_of_day": [3, 1, 4, 5, 6, 23]})
    uri = str(tmp_path / "training_examples")
    ex.write_delta(uri)
    config = {"data": {"train": [str(d[0]), str(d[0])]}, "train": {"item_svd": {"dim": 4, "serve_slices": 4}}}
    assert dict(fold_status(config, [d[2]], uri).iter_rows()) == {
        "b": "known", "c": "unseen", "d": "unseen", "e": "folded_today", "f": "folded_today"}
    one = {**config, "train": {"item_svd": {"dim": 4, "serve_slices": 1}}}  # the whole day in one slice
    assert dict(fold_status(one, [d[2]], uri).iter_rows()) == {
        "b": "known", "c": "unseen", "d": "unseen", "e": "unseen", "f": "unseen"}
    with pytest.raises(ValueError, match="divide 24"):
        fold_status({**config, "train": {"item_svd": {"serve_slices": 5}}}, [d[2]], uri)
