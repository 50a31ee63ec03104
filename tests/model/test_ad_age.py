"""E's NE split by the ad's age, the age read from `events` alone (gem_model.eval.ad_age)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from gem_model.eval.ad_age import ALL, ad_ages, eval_ne_by_age, ne_by_age
from gem_model.eval.metrics import normalized_entropy

E = dt.date(2026, 11, 7)


def _day(k: int) -> dt.date:
    return E + dt.timedelta(days=k)


# (ad_id, days relative to E, surface) of each impression
SEEN = [
    (1, -5, "feed"), (1, 0, "feed"),  # older
    (2, -3, "shops"), (2, 0, "feed"),  # older: first seen 3 days before E
    (3, -2, "feed"), (3, 0, "shops"),  # recent (E-2)
    (4, -1, "shops"), (4, 0, "feed"),  # recent (E-1, on another surface)
    (5, 0, "feed"), (5, 0, "shops"),  # new
    (6, 1, "feed"), (6, 0, "feed"),  # new: a later day does not count
]  # fmt: skip


def _events() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(SEEN))],
            "date": [_day(k) for _, k, _ in SEEN],
            "surface": [s for _, _, s in SEEN],
            "ad_id": [a for a, _, _ in SEEN],
        }
    )


def test_age_is_the_first_day_in_the_logs():
    ages = dict(ad_ages(_events(), E).iter_rows())
    on_e = {f"r{i}": a for i, (a, k, _) in enumerate(SEEN) if k == 0}
    assert set(ages) == set(on_e)  # E's impressions only
    want = {1: "older", 2: "older", 3: "recent", 4: "recent", 5: "new", 6: "new"}
    assert {r: ages[r] for r in on_e} == {r: want[a] for r, a in on_e.items()}
    # a day later: E+1's one impression (ad 6, first seen on E) is recent
    later = dict(ad_ages(_events(), _day(1)).iter_rows())
    assert later == {"r10": "recent"}


def test_ne_by_age_per_surface_and_pooled():
    rng = np.random.default_rng(0)
    n = 3000
    ages = pl.DataFrame(
        {"request_id": [f"q{i}" for i in range(n)], "ad_age": rng.choice(["new", "recent", "older"], n)}
    )
    p = rng.uniform(0.01, 0.2, n)
    rows = pl.DataFrame(
        {
            "request_id": [f"q{i}" for i in range(n)],
            "surface": rng.choice(["feed", "shops"], n),
            "click": (rng.random(n) < p).astype(np.int8),
            "p_click": p,
        }
    )
    out = ne_by_age(rows, ages)
    assert {(r["surface"], r["ad_age"]) for r in out} == {
        (s, a) for s in ("feed", "shops", ALL) for a in ("new", "recent", "older")
    }
    df = rows.join(ages, on="request_id")
    for r in out:
        sub = df if r["surface"] == ALL else df.filter(pl.col("surface") == r["surface"])
        sub = sub.filter(pl.col("ad_age") == r["ad_age"])
        y = sub["click"].to_numpy().astype(float)
        assert r["n"] == sub.height and r["positives"] == int(y.sum())
        assert r["ne"] == pytest.approx(normalized_entropy(y, sub["p_click"].to_numpy()))
    assert sum(r["n"] for r in out if r["surface"] == ALL) == n


def test_eval_ne_by_age_reads_the_lake(tmp_path):
    from deltalake import write_deltalake

    events = _events()
    write_deltalake(str(tmp_path / "events"), events.to_arrow(), partition_by=["date", "surface"])
    on_e = events.filter(pl.col("date") == E)
    preds = on_e.select(
        "request_id", "surface", pl.Series("click", [1, 0, 0, 1, 0, 1, 1], dtype=pl.Int8),
        pl.Series("p_click", [0.5, 0.2, 0.3, 0.6, 0.1, 0.4, 0.7]),
    )  # fmt: skip
    preds.write_parquet(tmp_path / "eval_predictions.parquet")
    out = eval_ne_by_age(tmp_path / "eval_predictions.parquet", E, events_uri=str(tmp_path / "events"))
    pooled = {r["ad_age"]: r for r in out if r["surface"] == ALL}
    assert {a: r["n"] for a, r in pooled.items()} == {"new": 3, "recent": 2, "older": 2}
    assert sum(r["n"] for r in out if r["surface"] != ALL) == 7


def test_version_report_is_the_foundation_reports_hook(tmp_path):
    """What the foundation asset adds to foundation_eval.json: the split of its version's E predictions,
    nothing for a version that saved none."""
    from deltalake import write_deltalake

    from gem_model.eval.ad_age import EVAL_PREDICTIONS, version_report

    lake = tmp_path / "lake"
    write_deltalake(str(lake / "events"), _events().to_arrow(), partition_by=["date", "surface"])
    assert version_report(tmp_path / "v1", E, str(lake)) == {}
    (tmp_path / "v1").mkdir()
    on_e = _events().filter(pl.col("date") == E)
    on_e.select(
        "request_id", "surface", pl.lit(1, pl.Int8).alias("click"), pl.lit(0.5).alias("p_click")
    ).write_parquet(tmp_path / "v1" / EVAL_PREDICTIONS)
    rows = version_report(tmp_path / "v1", E, str(lake))["ne_by_ad_age"]
    assert sum(r["n"] for r in rows if r["surface"] == ALL) == on_e.height
    # a lake of training examples alone (no events table to date the ads by): no split, no error
    assert version_report(tmp_path / "v1", E, str(tmp_path / "lake_without_events")) == {}
