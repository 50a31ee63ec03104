"""bench/counter_strength.py: the method-of-moments prior strength recovers a known beta prior."""

from __future__ import annotations

import importlib.util

import numpy as np
import polars as pl

from gem_model.config import REPO_ROOT

_spec = importlib.util.spec_from_file_location("counter_strength", REPO_ROOT / "bench" / "counter_strength.py")
assert _spec is not None and _spec.loader is not None
counter_strength = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counter_strength)


def _events(rng: np.random.Generator, rates: np.ndarray, n: int) -> pl.DataFrame:
    """n impressions of each ad (one user per impression), clicked with the ad's rate."""
    ads = np.repeat(np.arange(len(rates)), n)
    return pl.DataFrame({"surface": "feed", "ad_id": ads, "user_id": np.arange(len(ads)),
                         "click": (rng.random(len(ads)) < rates[ads]).astype(np.float64)})


def test_the_strength_of_a_beta_prior_is_recovered() -> None:
    rng = np.random.default_rng(0)
    strength, m = 50.0, 0.1
    rates = rng.beta(strength * m, strength * (1 - m), 3000)
    out = counter_strength.moment_strengths(_events(rng, rates, 40)).filter(pl.col("kind") == "ad").row(0, named=True)
    assert 40 < out["strength"] < 62
    assert abs(out["m"] - m) < 0.01
    # users were seen once each: no id of 2+ impressions, so no row for them
    assert counter_strength.moment_strengths(_events(rng, rates, 40)).filter(pl.col("kind") == "user").height == 0


def test_ids_that_all_share_one_rate_have_no_strength() -> None:
    rng = np.random.default_rng(1)
    out = counter_strength.moment_strengths(_events(rng, np.full(3000, 0.1), 40)).filter(pl.col("kind") == "ad")
    s = out.row(0, named=True)["strength"]
    assert s is None or s > 500  # the spread is binomial noise: the prior would be (near) infinitely strong
