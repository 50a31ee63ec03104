"""Counter features: how each impression's ad and user fared on its surface (and the user on every
surface, and on every other surface) on earlier days.

The classic counters of ads ranking: a model trained on days d2..d4 reads, on day E, the click
rates of ids over every day before E, so the freshest labels reach it without retraining.

Point in time: only impressions of days strictly before the row's day count (within the history's
lookback window), and of those a click only if it had arrived (`click_ts`) before the row's day
began: a late click on yesterday's impression is not yet known at midnight. The rate is shrunk to
the surface's rate over the same days (`prior_strength` pseudo-impressions) and given as log-odds
relative to it, so an unseen id reads 0; across surfaces, the rate it is shrunk to is the mean of
its impressions' surface rates (a user of a generous surface is not generous for it).

With `joint_passes` > 0 the ad's and the user's log-odds on a surface are instead the two offsets of
one L2 logistic regression on the earlier days (logit = logit(surface rate) + ad + user, the L2 being
`prior_strength` pseudo-impressions' curvature), fitted by that many backfitting sweeps of Newton steps:
marginal rates count a user's popular items twice (the user looks generous, the items look good),
the joint fit splits each click between the two.

`user_other_*` reads the user on every surface but the row's: what other surfaces say of a user,
apart from what the row's own surface already says (`user_all_*` holds both). `ad_other_*` does the
same for the ad: where one item is served on several surfaces (KuaiRand's videos in five tabs), a
small surface learns of a new ad from the big one.

With `moments` the ad's and the user's counters on a surface shrink by their own strength, estimated from the
same earlier days (`moment_strengths`: the spread of the ids' click rates beyond their binomial noise, as an
empirical-Bayes beta prior): where a surface's items barely differ (KuaiRand's tab 0) a few impressions
should move its ads little, where they differ much, far. The cross-surface and same-day counters keep
`prior_strength`.

`ad_today_*` and `ad_all_today_*` are the real-time counters: the ad earlier on the row's own day, on
its surface and on every surface, shrunk like the others. Only impressions strictly before the row's
`ts` count, and of those a click only once it had arrived (`click_ts` before the row's `ts`): an ad
born today is known only by them, and an ad's morning tells the model of its afternoon.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from gem_model.store.schemas import COUNTER_COLUMNS, TODAY_COUNTER_COLUMNS

_KEYS = {"ad": ["surface", "ad_id"], "user": ["surface", "user_id"], "user_all": ["user_id"]}
_TODAY = {"ad_today": ["surface", "ad_id"], "ad_all_today": ["ad_id"]}
_OTHER = {"user": "user_id", "ad": "ad_id"}  # {who}_other_*: on every surface but the row's
_EPS = 1e-3  # a surface with no clicks (or no non-clicks) yet still gives finite log-odds
_MAX_STRENGTH = 1000.0  # a surface whose ids' spread is all binomial noise: shrink (almost) fully
_MOMENT_KINDS = {"ad": "ad_id", "user": "user_id"}


def _logit(p: pl.Expr) -> pl.Expr:
    return (p / (1 - p)).log()


def moment_strengths(events: pl.DataFrame) -> pl.DataFrame:
    """surface, kind, ids, mean impressions, rate m, sd of the true rates s, strength m(1-m)/s^2 - 1 (null
    where the observed spread is all noise), from events (surface, ad_id, user_id, click as 0/1).

    For the ids of a surface with 2 or more impressions, the impression-weighted variance of their click
    rates is the variance of their true rates plus the binomial noise m(1-m)/n; what is left over is the
    spread of the true rates, s^2, and a beta prior with that spread is worth m(1-m)/s^2 - 1 pseudo-impressions."""
    rows = []
    for kind, key in _MOMENT_KINDS.items():
        per_id = (events.group_by("surface", key).agg(n=pl.len().cast(pl.Float64), k=pl.col("click").sum())
                  .filter(pl.col("n") >= 2).with_columns(r=pl.col("k") / pl.col("n")))
        stats = per_id.group_by("surface").agg(
            ids=pl.len(), mean_n=pl.col("n").mean(), m=pl.col("k").sum() / pl.col("n").sum(),
            r2=(pl.col("n") * pl.col("r") ** 2).sum() / pl.col("n").sum(),
            inv_n=pl.len() / pl.col("n").sum(),  # E[1/n] under impression weights: ids / impressions
        ).with_columns(vr=pl.col("r2") - pl.col("m") ** 2)  # the impression-weighted variance of the rates
        s2 = pl.col("vr") - pl.col("m") * (1 - pl.col("m")) * pl.col("inv_n")
        rows.append(stats.with_columns(kind=pl.lit(kind), s=s2.clip(0).sqrt(),
                                       strength=pl.when(s2 > 0).then(pl.col("m") * (1 - pl.col("m")) / s2 - 1)))
    out = pl.concat(rows).select("surface", "kind", "ids", "mean_n", "m", "s", "strength")
    return out.cast({"ids": pl.Int64, "mean_n": pl.Float64, "m": pl.Float64, "s": pl.Float64,
                     "strength": pl.Float64}).sort("kind", "surface")


def _surface_strengths(known: pl.DataFrame, prior_strength: float, moments: bool) -> pl.DataFrame:
    """surface, a_ad, a_user: each surface's strength for its ad and user counters (prior_strength unless
    `moments`; a surface without an id of 2+ impressions keeps prior_strength)."""
    surfaces = known.select("surface").unique()
    if not moments:
        return surfaces.with_columns(a_ad=pl.lit(prior_strength), a_user=pl.lit(prior_strength))
    est = moment_strengths(known.rename({"clicked": "click"})).with_columns(
        a=pl.col("strength").fill_null(_MAX_STRENGTH).clip(1.0, _MAX_STRENGTH))
    for kind in _MOMENT_KINDS:
        got = est.filter(pl.col("kind") == kind).select("surface", pl.col("a").alias(f"a_{kind}"))
        surfaces = surfaces.join(got, on="surface", how="left").with_columns(pl.col(f"a_{kind}").fill_null(prior_strength))
    return surfaces


def _joint_offsets(known: pl.DataFrame, passes: int) -> dict[str, pl.DataFrame]:
    """{"ad": (surface, ad_id, o), "user": (surface, user_id, o)}: the backfitted L2 logistic regression
    (`known` carries each surface's a_ad and a_user)."""
    v = pl.col("p0") * (1 - pl.col("p0"))
    k = known.with_columns(base=_logit(pl.col("p0")), l2_ad=pl.col("a_ad") * v, l2_user=pl.col("a_user") * v)
    offsets = {n: k.select(_KEYS[n]).unique().with_columns(o=pl.lit(0.0)) for n in ("ad", "user")}
    for _ in range(passes):
        for name, other in (("user", "ad"), ("ad", "user")):
            z = k.join(offsets[name], on=_KEYS[name], how="left").join(
                offsets[other].rename({"o": "o2"}), on=_KEYS[other], how="left"
            )
            p = 1 / (1 + (-(pl.col("base") + pl.col("o") + pl.col("o2"))).exp())
            step = z.group_by(_KEYS[name]).agg(
                o=pl.col("o").first(),
                g=(pl.col("clicked") - p).sum() - pl.col(f"l2_{name}").first() * pl.col("o").first(),
                h=(p * (1 - p)).sum() + pl.col(f"l2_{name}").first(),
            )
            offsets[name] = step.select(*_KEYS[name], o=(pl.col("o") + pl.col("g") / pl.col("h")).clip(-3.0, 3.0))
    return offsets


def attach_counters(
    day: pl.DataFrame, past: pl.DataFrame, date: dt.date, prior_strength: float, joint_passes: int = 0,
    moments: bool = False,
) -> pl.DataFrame:
    """`day` + COUNTER_COLUMNS from `past` (date, surface, ad_id, user_id, click, click_ts of earlier days), and
    TODAY_COUNTER_COLUMNS from `day` itself (its ts, click, click_ts), against the same surface rates."""
    if past.height and past["date"].max() >= date:  # type: ignore[operator]
        raise ValueError(f"counters for {date} were given impressions of {date} or later")
    midnight = dt.datetime.combine(date, dt.time(), tzinfo=dt.UTC)
    known = past.select(
        "surface", "ad_id", "user_id",
        clicked=((pl.col("click") == 1) & (pl.col("click_ts") < midnight)).fill_null(False).cast(pl.Float64),
    )  # fmt: skip
    prior = known.group_by("surface").agg(p0=pl.col("clicked").mean().clip(_EPS, 1 - _EPS))
    known = known.join(prior, on="surface", how="left").join(
        _surface_strengths(known, prior_strength, moments), on="surface", how="left")
    out, a = day, prior_strength
    joint = _joint_offsets(known, joint_passes) if joint_passes else {}
    # (keys, n, c, p) per counter, and of the ad on every surface: {who}_other_* is {who}_all minus the row's surface;
    # p0 of a key: its surface's rate; across surfaces, the mean of its impressions' surface rates
    sums = {name: known.group_by(keys).agg(n=pl.len().cast(pl.Float64), c=pl.col("clicked").sum(), p=pl.col("p0").mean(),
                                           a=pl.col(f"a_{name}").first() if name in _MOMENT_KINDS else pl.lit(a))
            for name, keys in {**_KEYS, "ad_all": ["ad_id"]}.items()}
    for name, keys in _KEYS.items():
        counts = sums[name]
        shrunk = (pl.col("c") + pl.col("a") * pl.col("p")) / (pl.col("n") + pl.col("a"))
        if name in joint:
            counts = counts.join(joint[name], on=keys, how="left")
            log_odds = pl.col("o")
        else:
            log_odds = _logit(shrunk) - _logit(pl.col("p"))
        out = out.join(counts, on=keys, how="left", maintain_order="left").with_columns(
            pl.col("n").fill_null(0.0).alias(f"{name}_impressions_before"),
            log_odds.fill_null(0.0).alias(f"{name}_click_logit_before"),
        ).drop("n", "c", "p", "a", *(["o"] if name in joint else []))
    for who, key in _OTHER.items():
        out = _attach_other(out, who, key, sums[f"{who}_all"], sums[who], a)
    out = _attach_today(out, prior, a)
    return out.cast({**COUNTER_COLUMNS, **TODAY_COUNTER_COLUMNS})  # type: ignore[arg-type]


def _attach_today(out: pl.DataFrame, prior: pl.DataFrame, a: float) -> pl.DataFrame:
    """ad_today_* and ad_all_today_*: the ad's impressions earlier on the row's day and its clicks known by the
    row's `ts`, shrunk to the mean surface rate of those impressions (0 where there are none, or no rate yet)."""
    rows = out.select("ts", "surface", "ad_id", "click", "click_ts").with_row_index("_row").join(
        prior, on="surface", how="left", maintain_order="left").sort("ts")  # time order; `_row` restores the day's
    for who, keys in _TODAY.items():
        # cumulative counts in time order; an as-of join strictly before each row's ts reads them
        shown = rows.select(
            *keys, "ts", n=(pl.int_range(pl.len()) + 1).over(keys).cast(pl.Float64),
            s=pl.col("p0").fill_null(0.0).cum_sum().over(keys), known=pl.col("p0").is_not_null().cum_sum().over(keys))
        clicked = rows.filter((pl.col("click") == 1) & pl.col("click_ts").is_not_null()).sort("click_ts").select(
            *keys, ts=pl.col("click_ts"), c=(pl.int_range(pl.len()) + 1).over(keys).cast(pl.Float64))
        asof = {"on": "ts", "by": keys, "strategy": "backward", "allow_exact_matches": False, "check_sortedness": False}
        got = (rows.select("_row", *keys, "ts").join_asof(shown, **asof).join_asof(clicked, **asof)
               .select("_row", n=pl.col("n").fill_null(0.0), c=pl.col("c").fill_null(0.0), s=pl.col("s"),
                       known=pl.col("known").fill_null(0)))
        p = (pl.col("s") / pl.col("known")).clip(_EPS, 1 - _EPS)
        log_odds = _logit((pl.col("c") + a * p) / (pl.col("n") + a)) - _logit(p)
        rows = rows.join(got.select("_row", **{
            f"{who}_impressions_before": pl.col("n"),
            f"{who}_click_logit_before": pl.when(pl.col("known") > 0).then(log_odds).otherwise(0.0),
        }), on="_row", how="left", maintain_order="left")
    return out.with_columns(rows.sort("_row").select(*TODAY_COUNTER_COLUMNS))


def _attach_other(out: pl.DataFrame, who: str, key: str, on_all: pl.DataFrame, on_own: pl.DataFrame,
                  a: float) -> pl.DataFrame:
    """{who}_other_*: the id's impressions and shrunk relative log-odds on every surface but the row's
    (its counts on every surface minus the row's surface's), shrunk as user_all_* is."""
    as_sums = [pl.col("n"), pl.col("c"), (pl.col("p") * pl.col("n")).alias("s")]  # s: the impressions' summed p0
    on_all = on_all.select(key, *(e.name.suffix("_all") for e in as_sums))
    on_own = on_own.select("surface", key, *as_sums)
    other = {k: pl.col(f"{k}_all").fill_null(0.0) - pl.col(k).fill_null(0.0) for k in ("n", "c", "s")}
    p = (pl.col("s_o") / pl.col("n_o")).clip(_EPS, 1 - _EPS)
    log_odds = _logit((pl.col("c_o") + a * p) / (pl.col("n_o") + a)) - _logit(p)
    return (
        out.join(on_all, on=key, how="left", maintain_order="left")
        .join(on_own, on=["surface", key], how="left", maintain_order="left")
        .with_columns(**{f"{k}_o": v for k, v in other.items()})
        .with_columns(**{
            f"{who}_other_impressions_before": pl.col("n_o"),
            f"{who}_other_click_logit_before": pl.when(pl.col("n_o") > 0).then(log_odds).otherwise(0.0),
        })
        .drop("n_all", "c_all", "s_all", "n", "c", "s", "n_o", "c_o", "s_o")
    )
