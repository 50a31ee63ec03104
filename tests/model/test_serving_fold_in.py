"""gem_model.distill.serving_fold_in: the fold status of an ad read from the logs against the model's
window, and the per-status map fitted on the map's days (the day's own new ads cannot be folded:
one map per surface left them at 0.73 of their rate on the evaluation world's week)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from gem_model.distill.serving_fold_in import STATUS_MIN_POSITIVES, fold_status, status_maps, with_status_maps


def _status_rows(n: int = 20000, seed: int = 0) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    """Rows of three statuses against their truth: unseen under-predicted, folded over-predicted and with its
    logits spread half as wide as the truth's (a slope of 2 undoes it), known right."""
    rng = np.random.default_rng(seed)
    status = rng.choice(["known", "folded", "unseen"], n)
    true = rng.normal(-4.0, 1.0, n) + np.where(status == "unseen", 0.7, 0.0)
    y = (rng.random(n) < 1 / (1 + np.exp(-true))).astype(float)
    z = np.where(status == "folded", -1.5 + 0.5 * true, np.where(status == "unseen", true - 0.7, true))
    rows = pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "click": y, "p_click": 1 / (1 + np.exp(-z)),
                         "fold_status": status})
    return rows, status, y


def test_status_maps_bring_each_status_to_its_click_rate_and_undo_a_narrow_spread():
    rows, status, y = _status_rows()
    maps = status_maps(rows)
    (a_unseen, b_unseen), (a_folded, _), (a_known, b_known) = maps["unseen"], maps["folded"], maps["known"]
    assert b_unseen + (a_unseen - 1) * -4.0 > 0.4  # lifted at the typical logit
    assert 1.6 < a_folded < 2.5 and abs(a_known - 1) < 0.2 and abs(b_known + (a_known - 1) * -4.0) < 0.2
    out = with_status_maps(rows.select("request_id", "p_click"), rows.select("request_id", "fold_status"), maps)
    assert out.columns == ["request_id", "p_click"] and out.height == len(y)
    for s in ("known", "folded", "unseen"):
        m = status == s
        assert out["p_click"].to_numpy()[m].mean() == pytest.approx(y[m].mean(), rel=1e-3)
    # the slope is what the folded rows needed: a shift alone leaves them worse ranked within the status
    shifted = with_status_maps(rows.select("request_id", "p_click"), rows.select("request_id", "fold_status"),
                               status_maps(rows, "shift"))
    assert all(a == 1.0 for a, _ in status_maps(rows, "shift").values())
    m = status == "folded"

    def loss(p: np.ndarray) -> float:
        return float(-np.mean(y[m] * np.log(p[m]) + (1 - y[m]) * np.log(1 - p[m])))

    assert loss(out["p_click"].to_numpy()) < loss(shifted["p_click"].to_numpy())
    with pytest.raises(ValueError, match="platt or shift"):
        status_maps(rows, "isotonic")


def test_status_maps_leave_thin_statuses_and_rows_without_a_status_alone():
    rows, _, _ = _status_rows()
    unseen = rows.filter(pl.col("fold_status") == "unseen")
    few = pl.concat([unseen.filter(pl.col("click") == 0), unseen.filter(pl.col("click") == 1).head(STATUS_MIN_POSITIVES - 1)])
    assert set(status_maps(pl.concat([few, rows.filter(pl.col("fold_status") != "unseen")]))) == {"known", "folded"}
    maps = status_maps(rows)
    kept = with_status_maps(rows.select("request_id", "p_click"), rows.head(10).select("request_id", "fold_status"), maps)
    assert np.allclose(kept["p_click"].to_numpy()[10:], rows["p_click"].to_numpy()[10:])
    assert not np.allclose(kept["p_click"].to_numpy()[:10], rows["p_click"].to_numpy()[:10])


def test_a_surface_moved_off_its_level_by_the_pooled_status_maps_is_shifted_back():
    """The status maps are pooled over surfaces: a surface whose rows of a status are mispredicted unlike the
    other surface's ends off its click rate; one shift per surface (relevel_surfaces) brings it back, and a
    surface with too few clicks keeps what the status maps gave it."""
    rows, status, y = _status_rows()
    n = len(y)
    # on surface b the folded rows were over-predicted half as much again (a bias the pooled map cannot see)
    surface = np.where(np.arange(n) % 3 == 0, "b", "a")
    z = np.log(rows["p_click"].to_numpy() / (1 - rows["p_click"].to_numpy()))
    z = z + np.where((surface == "b") & (status == "folded"), 0.8, 0.0)
    rows = rows.with_columns(pl.Series("p_click", 1 / (1 + np.exp(-z))), pl.Series("surface", surface))
    statuses = rows.select("request_id", "fold_status")
    after = with_status_maps(rows, statuses, status_maps(rows))
    rate = {s: y[surface == s].mean() for s in ("a", "b")}
    off = {s: after.filter(pl.col("surface") == s)["p_click"].mean() / rate[s] for s in ("a", "b")}
    assert off["b"] > 1.05 and off["a"] < 0.99  # b above its rate, a below
    levels = status_maps(after, "shift", by="surface")
    assert set(levels) == {"a", "b"} and all(a == 1.0 for a, _ in levels.values())
    out = with_status_maps(after, after.select("request_id", "surface"), levels, by="surface")
    for s in ("a", "b"):
        assert out.filter(pl.col("surface") == s)["p_click"].mean() == pytest.approx(rate[s], rel=1e-3)
    thin = pl.concat([after.filter(pl.col("surface") == "a"),
                      after.filter((pl.col("surface") == "b") & (pl.col("click") == 0)).head(500)])
    assert set(status_maps(thin, "shift", by="surface")) == {"a"}


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
