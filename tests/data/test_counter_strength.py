"""The counters' method-of-moments prior strength (bench/counter_strength.py prints it; `counters.moments`
shrinks by it): it recovers a known beta prior, and the counters shrink by it per surface."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from gem_pipelines.data.counters import attach_counters, moment_strengths


def _events(rng: np.random.Generator, rates: np.ndarray, n: int) -> pl.DataFrame:
    """n impressions of each ad (one user per impression), clicked with the ad's rate."""
    ads = np.repeat(np.arange(len(rates)), n)
    return pl.DataFrame({"surface": "feed", "ad_id": ads, "user_id": np.arange(len(ads)),
                         "click": (rng.random(len(ads)) < rates[ads]).astype(np.float64)})


def test_the_strength_of_a_beta_prior_is_recovered() -> None:
    rng = np.random.default_rng(0)
    strength, m = 50.0, 0.1
    rates = rng.beta(strength * m, strength * (1 - m), 3000)
    out = moment_strengths(_events(rng, rates, 40)).filter(pl.col("kind") == "ad").row(0, named=True)
    assert 40 < out["strength"] < 62
    assert abs(out["m"] - m) < 0.01
    # users were seen once each: no id of 2+ impressions, so no row for them
    assert moment_strengths(_events(rng, rates, 40)).filter(pl.col("kind") == "user").height == 0


def test_ids_that_all_share_one_rate_have_no_strength() -> None:
    rng = np.random.default_rng(1)
    out = moment_strengths(_events(rng, np.full(3000, 0.1), 40)).filter(pl.col("kind") == "ad")
    s = out.row(0, named=True)["strength"]
    assert s is None or s > 500  # the spread is binomial noise: the prior would be (near) infinitely strong


def _two_surfaces(rng: np.random.Generator, day: dt.date) -> pl.DataFrame:
    """Earlier-day impressions: on `same` 400 ads share one 10% rate, on `spread` their rates are beta(5, 45)."""
    frames = [_events(rng, rates, 30).with_columns(surface=pl.lit(surface))
              for surface, rates in (("same", np.full(400, 0.1)), ("spread", rng.beta(5.0, 45.0, 400)))]
    ts = dt.datetime.combine(day - dt.timedelta(days=1), dt.time(8), tzinfo=dt.UTC)
    return pl.concat(frames).with_columns(
        date=pl.lit(day - dt.timedelta(days=1)), click=pl.col("click").cast(pl.Int8),
        click_ts=pl.when(pl.col("click") == 1).then(pl.lit(ts)), ts=pl.lit(ts))


def test_moments_shrink_each_surfaces_counters_by_its_own_strength() -> None:
    rng = np.random.default_rng(2)
    day = dt.date(2026, 11, 4)
    past = _two_surfaces(rng, day)
    today = past.group_by("surface", "ad_id").agg(pl.all().first()).with_columns(
        date=pl.lit(day), ts=pl.lit(dt.datetime.combine(day, dt.time(9), tzinfo=dt.UTC)),
        click_ts=pl.lit(None, dtype=pl.Datetime("us", "UTC")))
    fixed = attach_counters(today, past, day, prior_strength=10.0, moments=False)
    moments = attach_counters(today, past, day, prior_strength=10.0, moments=True)

    def spread(out: pl.DataFrame, surface: str) -> float:
        return float(out.filter(pl.col("surface") == surface)["ad_click_logit_before"].std())  # type: ignore[arg-type]

    # one shared rate: every ad's difference is noise, and the estimated strength (hundreds or more) all but erases it
    assert spread(moments, "same") < 0.3 * spread(fixed, "same")
    # rates that truly differ (strength 49 against 10): shrunk harder, but far less than on `same`
    assert 0.3 * spread(fixed, "spread") < spread(moments, "spread") < spread(fixed, "spread")
    # the counts are counts whatever the strength
    assert moments["ad_impressions_before"].equals(fixed["ad_impressions_before"])
