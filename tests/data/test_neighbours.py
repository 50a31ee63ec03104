"""Neighbour counters: the ad's earlier ratings by users whose ratings resemble the row's user's,
on every surface or on the row's surface alone (gem_pipelines/data/neighbours.py)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from gem_pipelines.data.neighbours import attach_neighbours

ALL, OWN = "ad_neighbours_click_before", "ad_neighbours_own_click_before"


def known(spec: list[tuple[str, int, int, int]]) -> pl.DataFrame:
    """(surface, ad_id, user_id, clicked) of earlier days."""
    return pl.DataFrame(spec, orient="row", schema={"surface": pl.String, "ad_id": pl.Int64, "user_id": pl.Int64,
                                                    "clicked": pl.Float64})


def day(spec: list[tuple[str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(spec, orient="row", schema={"surface": pl.String, "ad_id": pl.Int64, "user_id": pl.Int64})


def test_a_user_reads_the_ad_through_users_of_like_taste() -> None:
    # user 1 clicked ad 1, not ad 2; user 2 likewise, and clicked ad 3; user 3 the opposite, and not ad 3
    past = known([("feed", 1, 1, 1), ("feed", 2, 1, 0),
                  ("feed", 1, 2, 1), ("feed", 2, 2, 0), ("feed", 3, 2, 1),
                  ("feed", 1, 3, 0), ("feed", 2, 3, 1), ("feed", 3, 3, 0)])
    out = attach_neighbours(day([("feed", 3, 1), ("feed", 9, 1)]), past)
    # ratings relative to each user's rate: user 1 (.5, -.5), user 2 (1/3, -2/3, 1/3), user 3 (-1/3, 2/3, -1/3)
    sim = 0.5 / (math.sqrt(0.5) * math.sqrt(6 / 9))  # users 1 and 2 (and, negated, 1 and 3)
    expected = (sim * (1 / 3) + (-sim) * (-1 / 3)) / (2 * sim + 1)
    assert out[ALL][0] == pytest.approx(expected) and expected > 0  # the like-minded user clicked it
    assert out[OWN][0] == pytest.approx(expected)  # one surface: its likeness is the likeness
    assert out[ALL][1] == out[OWN][1] == 0.0  # an ad nobody rated before


def test_likeness_on_other_surfaces_reaches_a_surface_where_two_users_never_met() -> None:
    # users 1 and 4 rated reels alike; on feed they share no ad, and user 4 clicked ad 3, not ad 4
    past = known([("reels", 10, 1, 1), ("reels", 11, 1, 0), ("reels", 10, 4, 1), ("reels", 11, 4, 0),
                  ("feed", 3, 4, 1), ("feed", 4, 4, 0)])
    out = attach_neighbours(day([("feed", 3, 1), ("feed", 3, 4)]), past)
    # all surfaces: the two reels ratings (.5, -.5) are all of user 1's, half of user 4's
    sim = 0.5 / (math.sqrt(0.5) * 1.0)
    assert out[ALL][0] == pytest.approx(sim * 0.5 / (sim + 1))
    assert out[OWN][0] == 0.0  # on feed alone user 1 has no rating, so no likeness to anybody
    assert out[ALL][1] == out[OWN][1] == 0.0  # a user's own earlier rating is not a neighbour's
    assert out.columns[:3] == ["surface", "ad_id", "user_id"] and out.height == 2  # rows and order kept
