"""Counter features: earlier days only, clicks only once they had arrived, shrunk to the surface."""

from __future__ import annotations

import datetime as dt
import math

import polars as pl
import pytest

from gem_pipelines.data.counters import attach_counters
from gem_pipelines.data.formats import COUNTER_COLUMNS, TODAY_COUNTER_COLUMNS

D = dt.date(2026, 11, 4)


def at(day: dt.date, hour: int) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(hour), tzinfo=dt.UTC)


def rows(spec: list[tuple[dt.date, str, int, int, int, dt.datetime | None]]) -> pl.DataFrame:
    """(date, surface, ad_id, user_id, click, click_ts) rows, shown (`ts`) at 08:00 of their day."""
    return pl.DataFrame(
        spec, orient="row",
        schema={"date": pl.Date, "surface": pl.String, "ad_id": pl.Int64, "user_id": pl.Int64,
                "click": pl.Int8, "click_ts": pl.Datetime("us", "UTC")},
    ).with_columns(ts=pl.col("date").cast(pl.Datetime("us")).dt.replace_time_zone("UTC") + dt.timedelta(hours=8))  # fmt: skip


def logit(p: float) -> float:
    return math.log(p / (1 - p))


PAST = rows([
    (D - dt.timedelta(days=2), "feed", 7, 1, 1, at(D - dt.timedelta(days=2), 13)),
    (D - dt.timedelta(days=1), "feed", 7, 2, 1, at(D - dt.timedelta(days=1), 13)),
    (D - dt.timedelta(days=1), "feed", 7, 1, 0, None),
    (D - dt.timedelta(days=1), "feed", 8, 1, 0, None),
    (D - dt.timedelta(days=1), "reels", 7, 1, 1, at(D - dt.timedelta(days=1), 9)),
])  # fmt: skip
TODAY = rows([(D, "feed", 7, 1, 1, at(D, 10)), (D, "feed", 9, 3, 0, None), (D, "reels", 8, 1, 0, None)])


def test_counters_are_the_shrunk_click_log_odds_of_earlier_days_relative_to_the_surface() -> None:
    out = attach_counters(TODAY, PAST, D, prior_strength=2.0)
    assert out.height == TODAY.height and out["ad_id"].to_list() == [7, 9, 8]  # row order kept
    feed = out.row(0, named=True)
    p0 = 2 / 4  # feed: 2 clicks in 4 earlier impressions
    assert feed["ad_impressions_before"] == 3.0  # ad 7 on feed; its reels impression is another surface
    assert feed["ad_click_logit_before"] == pytest.approx(logit((2 + 2 * p0) / (3 + 2)) - logit(p0))
    assert feed["user_impressions_before"] == 3.0  # user 1 on feed: ad 7 twice, ad 8 once
    assert feed["user_click_logit_before"] == pytest.approx(logit((1 + 2 * p0) / (3 + 2)) - logit(p0))
    # user 1 on every surface: 2 clicks in 4, against the mean rate of the surfaces it was shown on
    p_reels = 1 - 1e-3  # a surface of clicks only: the prior is clipped, the log-odds stay finite
    p_all = (3 * p0 + p_reels) / 4  # three feed impressions, one on reels (a clipped 100% rate)
    assert feed["user_all_impressions_before"] == 4.0
    assert feed["user_all_click_logit_before"] == pytest.approx(logit((2 + 2 * p_all) / (4 + 2)) - logit(p_all))
    assert feed["user_all_click_logit_before"] < 0  # half its clicks where its surfaces give 62%
    # user 1 on every surface but feed: its one reels impression, clicked, against reels' rate
    assert feed["user_other_impressions_before"] == 1.0
    assert feed["user_other_click_logit_before"] == pytest.approx(logit((1 + 2 * p_reels) / 3) - logit(p_reels))
    unseen = out.row(1, named=True)  # ad 9 and user 3 never shown: no evidence either way
    cols = [*COUNTER_COLUMNS, *TODAY_COUNTER_COLUMNS]
    assert [unseen[c] for c in cols] == [0.0] * len(cols)
    reels = out.row(2, named=True)  # ad 8 never on reels; user 1 clicked the one reels impression
    # ... and on every surface but reels: its three feed impressions, one clicked, against feed's rate
    assert reels["user_other_impressions_before"] == 3.0
    assert reels["user_other_click_logit_before"] == pytest.approx(feed["user_click_logit_before"])
    assert reels["ad_impressions_before"] == 0.0 and reels["ad_click_logit_before"] == 0.0
    # ... but on feed it was shown once, unclicked: what another surface says of a new ad
    assert reels["ad_other_impressions_before"] == 1.0
    assert reels["ad_other_click_logit_before"] == pytest.approx(logit((0 + 2 * p0) / (1 + 2)) - logit(p0))
    # ad 7 on every surface but feed: its one reels impression, clicked
    assert feed["ad_other_impressions_before"] == 1.0
    assert feed["ad_other_click_logit_before"] == pytest.approx(feed["user_other_click_logit_before"])
    assert reels["user_impressions_before"] == 1.0
    assert reels["user_click_logit_before"] == pytest.approx(logit((1 + 2 * p_reels) / 3) - logit(p_reels))


def test_no_label_of_the_day_itself_reaches_its_counters() -> None:
    flipped = TODAY.with_columns(click=1 - pl.col("click"), click_ts=pl.lit(at(D, 1)))
    cols = list(COUNTER_COLUMNS)  # the earlier days' (the same day's read the day's own clicks, as they arrive)
    assert attach_counters(flipped, PAST, D, 2.0).select(cols).equals(attach_counters(TODAY, PAST, D, 2.0).select(cols))
    with pytest.raises(ValueError, match="or later"):
        attach_counters(TODAY, pl.concat([PAST, TODAY]), D, 2.0)


def _day(spec: list[tuple[int, str, int, int, int | None]]) -> pl.DataFrame:
    """Rows of D: (hour shown, surface, ad_id, click, hour the click arrived or None)."""
    return pl.DataFrame(
        [(D, s, ad, 1, c, at(D, h), at(D, ch) if ch is not None else None) for h, s, ad, c, ch in spec], orient="row",
        schema={"date": pl.Date, "surface": pl.String, "ad_id": pl.Int64, "user_id": pl.Int64, "click": pl.Int8,
                "ts": pl.Datetime("us", "UTC"), "click_ts": pl.Datetime("us", "UTC")},
    )  # fmt: skip


def test_same_day_counters_read_only_what_had_happened_before_the_impression() -> None:
    # ad 5, born today: shown on feed at 9 (clicked, the click in at 10), 9 (not clicked), 11, 11, and on reels at 10
    today = _day([(9, "feed", 5, 1, 10), (9, "feed", 5, 0, None), (10, "reels", 5, 0, None),
                  (11, "feed", 5, 1, 12), (11, "feed", 5, 0, None), (12, "feed", 6, 0, None)])  # fmt: skip
    out = attach_counters(today, PAST, D, 2.0)
    assert out["ad_id"].to_list() == today["ad_id"].to_list()  # row order kept
    n = out["ad_today_impressions_before"].to_list()
    assert n == [0.0, 0.0, 0.0, 2.0, 2.0, 0.0]  # the same hour does not count; reels is another surface
    assert out["ad_all_today_impressions_before"].to_list() == [0.0, 0.0, 2.0, 3.0, 3.0, 0.0]
    p_feed = 2 / 4  # the surface rates of the earlier days, as for the other counters
    at_11 = out.row(3, named=True)  # one click of two, known since 10
    assert at_11["ad_today_click_logit_before"] == pytest.approx(logit((1 + 2 * p_feed) / (2 + 2)) - logit(p_feed))
    p_reels = 1 - 1e-3
    p_all = (2 * p_feed + p_reels) / 3
    assert at_11["ad_all_today_click_logit_before"] == pytest.approx(logit((1 + 2 * p_all) / (3 + 2)) - logit(p_all))
    # at 10 the reels row sees both feed impressions of 9 but not yet the click that arrives at 10
    assert out.row(2, named=True)["ad_all_today_click_logit_before"] == pytest.approx(
        logit(2 * p_feed / (2 + 2)) - logit(p_feed))
    # nothing later in the day reaches an earlier row: the day cut before 11:00 gives its rows the same counters
    cut = attach_counters(today.filter(pl.col("ts") < at(D, 11)), PAST, D, 2.0)
    cols = list(TODAY_COUNTER_COLUMNS)
    assert cut.select(cols).equals(out.head(cut.height).select(cols))
    # and a row's own label, or a later one, changes nothing of its own counters
    flipped = attach_counters(today.with_columns(click=pl.lit(0, pl.Int8), click_ts=pl.lit(None, pl.Datetime("us", "UTC"))), PAST, D, 2.0)
    assert flipped.row(2, named=True)["ad_all_today_impressions_before"] == 2.0
    assert flipped.row(3, named=True)["ad_today_click_logit_before"] < at_11["ad_today_click_logit_before"]


def test_same_day_counters_of_a_first_day_read_no_rate() -> None:
    today = _day([(9, "feed", 5, 1, 9), (11, "feed", 5, 0, None)])
    out = attach_counters(today, PAST.clear(), D, 2.0)  # no earlier day: no surface rate to shrink to
    assert out["ad_today_impressions_before"].to_list() == [0.0, 1.0]
    assert out["ad_today_click_logit_before"].to_list() == [0.0, 0.0]


def test_a_click_that_arrives_after_midnight_is_not_yet_known() -> None:
    late = PAST.with_columns(
        click_ts=pl.when(pl.col("ad_id") == 7).then(pl.lit(at(D, 3))).otherwise(pl.col("click_ts"))
    )
    out = attach_counters(TODAY, late, D, 2.0).row(0, named=True)
    assert out["ad_impressions_before"] == 3.0  # the impressions were seen
    p0 = 1e-3  # no feed click known at midnight: the surface's rate is clipped
    assert out["ad_click_logit_before"] == pytest.approx(logit(2 * p0 / (3 + 2)) - logit(p0))
    assert out["ad_click_logit_before"] < 0  # three impressions, no click known: below the surface


def _confounded() -> tuple[pl.DataFrame, pl.DataFrame]:
    """One earlier day of feed: ad 7 clicked by users 1, 3, 4; ad 8 by nobody (users 2, 3, 4)."""
    y = D - dt.timedelta(days=1)
    past = rows([(y, "feed", ad, u, int(ad == 7), at(y, 13) if ad == 7 else None)
                 for ad, users in ((7, (1, 3, 4)), (8, (2, 3, 4))) for u in users])  # fmt: skip
    today = rows([(D, "feed", ad, u, 0, None) for ad, u in ((7, 1), (8, 2), (7, 3), (8, 4))])
    return past, today


def test_the_joint_fit_does_not_count_a_users_popular_items_twice() -> None:
    past, today = _confounded()
    marginal = attach_counters(today, past, D, 2.0).row(0, named=True)
    joint = attach_counters(today, past, D, 2.0, joint_passes=20).row(0, named=True)
    # user 1 only ever saw the ad everybody clicks: its marginal rate says generous, the joint fit
    # gives most of that click to the ad
    assert joint["user_click_logit_before"] < marginal["user_click_logit_before"]
    assert joint["ad_click_logit_before"] > 0 > attach_counters(today, past, D, 2.0, joint_passes=20).row(1, named=True)[
        "ad_click_logit_before"]
    assert joint["ad_impressions_before"] == marginal["ad_impressions_before"] == 3.0  # counts unchanged


def test_joint_passes_converge_to_the_l2_logistic_regression() -> None:
    past, today = _confounded()
    a = 2.0
    out = attach_counters(today, past, D, a, joint_passes=50)
    ad = dict(zip(out["ad_id"], out["ad_click_logit_before"], strict=True))
    user = dict(zip(out["user_id"], out["user_click_logit_before"], strict=True))
    p0 = 3 / 6
    l2 = a * p0 * (1 - p0)
    z = [logit(p0) + ad[r["ad_id"]] + user[r["user_id"]] for r in past.iter_rows(named=True)]
    resid = [r["click"] - 1 / (1 + math.exp(-zi)) for r, zi in zip(past.iter_rows(named=True), z, strict=True)]
    for key, offsets in (("ad_id", ad), ("user_id", user)):
        for k, o in offsets.items():  # the penalised score of every offset is 0 at the optimum
            g = sum(e for r, e in zip(past.iter_rows(named=True), resid, strict=True) if r[key] == k) - l2 * o
            assert abs(g) < 1e-4, (key, k, g)
