"""The embedded default data source: a seeded generative world that writes raw landing files.

The world (users with latent topic interests, advertisers, ads, organic items) derives from the
seed alone. One day of one surface derives from (seed, date, surface) alone, so any partition can
be materialised by itself, in any order, and re-materialising it gives byte-identical files.

Interests drift day by day without replaying history: user u's interest on day t is
    sqrt(rho) * S_u + sqrt(1 - rho) * (cos(theta_u(t)) A_u + sin(theta_u(t)) B_u),
    theta_u(t) = interest_drift * t + phi_u,
with S, A, B independent N(0, 1) matrices (so every coordinate stays N(0, 1) on every day, and the
day-to-day correlation is rho + (1 - rho) cos(interest_drift)).

Labels: p_click = sigmoid(surface bias + ad quality + advertiser quality + position + objective
+ creative format + device + hour + user propensity + gamma * affinity), where affinity is the
user's current interest in the ad's topic. Users are active on several surfaces, and their organic
activity (items drawn from a softmax over current interests) plus their paid clicks reveal those
interests across surfaces: that is where most of the learnable signal lives. Conversions exist only
on surfaces whose tasks include "conversion": p_conversion = p_click * p(conversion | click).

Raw files follow `gem_pipelines.data.formats` exactly; `corruption_rate` of the raw records are
corrupted realistically (see `_reasons_for`), and `SimulatedPartition.n_corrupted` says how many
records of each quarantine reason the parser should find.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gem_model.config import SimulatorConfig, Surface, SurfacesConfig
from gem_pipelines.data import formats as F

__all__ = [
    "SimulatedPartition",
    "simulate_partition",
    "simulate_day_frames",
    "user_interests",
    "interest_affinity",
    "applicable_reasons",
]

_EPOCH = dt.date(2020, 1, 1)
_REF_DAY = (dt.date(2026, 1, 1) - _EPOCH).days  # users' signup days are drawn before this day
_DAY_MS = 86_400_000

# --- difficulty knobs (calibrated: see tests/data/test_simulator.py) ---------------------------
_RHO = 0.5  # share of interest variance that never drifts
_GAMMA = 1.05  # weight of affinity (user interest in the ad's topic) in the click logit
_BETA_AD = 1.0  # targeting sharpness (softmax over the user's interests)
_BETA_ORGANIC = 1.5  # how strongly organic activity follows interests
_TARGETED = 0.5  # fraction of impressions whose ad is targeted at the user's interests
_CTR_RANGE = (0.012, 0.035)  # per-surface target click rate (drawn per surface from the seed)
_LOGIT_OFFSET = 1.25  # E[sigmoid(b + X)] ~ sigmoid(b + offset) for the logit spread used here
_OBJECTIVE_EFFECT = {"awareness": -0.25, "traffic": 0.2, "app_installs": 0.0, "conversions": -0.1}
_FORMAT_EFFECT = {"image": 0.0, "video": 0.15, "carousel": 0.1, "collection": -0.1}
_DEVICE_EFFECT = {"ios": 0.05, "android": 0.0, "web": -0.15}
_CVC_LOGIT = {"awareness": -3.4, "traffic": -2.8, "app_installs": -2.0, "conversions": -1.4}
_POSITION_P = np.array([1.0 / p**0.8 for p in range(1, 11)])
_POSITION_P = _POSITION_P / _POSITION_P.sum()
_HOURS = np.arange(24)
_DIURNAL = 1.0 + 0.7 * np.cos(2 * np.pi * (_HOURS - 20) / 24)
_DIURNAL = _DIURNAL / _DIURNAL.sum()
_ACTION_P = np.array([0.55, 0.18, 0.05, 0.04, 0.06, 0.12])  # formats.ORGANIC_ACTIONS order


# ------------------------------------------------------------------------------------------------
# World
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grouped:
    """Items sorted by topic with cumulative weights, for vectorised sampling within a topic."""

    order: np.ndarray  # item indices sorted by topic
    cum: np.ndarray  # len n + 1 cumulative weights in `order`
    start: np.ndarray  # per topic, first position in `order`
    end: np.ndarray  # per topic, one past the last position
    present: np.ndarray  # per topic, bool: has at least one item

    @staticmethod
    def build(topic: np.ndarray, weight: np.ndarray, n_topics: int) -> _Grouped:
        order = np.argsort(topic, kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(weight[order])])
        counts = np.bincount(topic, minlength=n_topics)
        end = np.cumsum(counts)
        return _Grouped(order, cum, end - counts, end, counts > 0)

    def sample(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        lo, hi = self.cum[self.start[topics]], self.cum[self.end[topics]]
        r = lo + rng.random(len(topics)) * (hi - lo)
        pos = np.searchsorted(self.cum, r, side="right") - 1
        pos = np.clip(pos, self.start[topics], self.end[topics] - 1)
        return self.order[pos]


@dataclass(frozen=True)
class _World:
    n_topics: int
    interest_s: np.ndarray  # (U, T)
    interest_a: np.ndarray
    interest_b: np.ndarray
    phase: np.ndarray  # (U,)
    user_activity: np.ndarray  # (U,)
    user_device: np.ndarray  # (U,) index into DEVICES
    user_signup_day: np.ndarray  # (U,) float day index
    user_propensity: np.ndarray  # (U,) logit offset
    ad_advertiser: np.ndarray  # (A,) 0-based
    ad_topic: np.ndarray
    ad_objective: np.ndarray
    ad_format: np.ndarray
    ad_quality: np.ndarray  # logit offset incl. advertiser quality
    ad_conv_quality: np.ndarray
    ad_bid: np.ndarray
    ad_serve_p: np.ndarray  # untargeted serving distribution
    ads: _Grouped
    item_topic: np.ndarray  # organic items, 0-based
    items: _Grouped


def _world_key(cfg: SimulatorConfig) -> tuple[int, ...]:
    return (cfg.seed, cfg.n_users, cfg.n_advertisers, cfg.n_ads, cfg.n_organic_items, cfg.n_topics)


@functools.lru_cache(maxsize=8)
def _world(seed: int, n_users: int, n_advertisers: int, n_ads: int, n_items: int, n_topics: int) -> _World:
    rng = np.random.default_rng([seed, 0x5EED])
    U, T, A, V, I = n_users, n_topics, n_ads, n_advertisers, n_items
    s, a, b = (rng.standard_normal((U, T)) for _ in range(3))
    phase = rng.uniform(0, 2 * np.pi, U)
    activity = rng.lognormal(0.0, 0.8, U)
    device = rng.choice(len(F.DEVICES), U, p=[0.45, 0.4, 0.15])
    signup = _REF_DAY - rng.lognormal(5.0, 1.2, U)
    propensity = rng.normal(0.0, 0.3, U)

    adv_quality = rng.normal(0.0, 0.3, V)
    adv_objective = rng.choice(len(F.OBJECTIVES), V, p=[0.2, 0.3, 0.2, 0.3])
    ad_adv = rng.integers(0, V, A)
    ad_adv[: min(A, V)] = rng.permutation(V)[: min(A, V)]  # every advertiser has an ad where possible
    ad_topic = rng.permutation(np.arange(A) % T)
    # most of an advertiser's ads share its objective
    ad_obj = np.where(rng.random(A) < 0.8, adv_objective[ad_adv], rng.integers(0, len(F.OBJECTIVES), A))
    ad_fmt = rng.choice(len(F.CREATIVE_FORMATS), A, p=[0.4, 0.3, 0.2, 0.1])
    obj_eff = np.array([_OBJECTIVE_EFFECT[o] for o in F.OBJECTIVES])
    fmt_eff = np.array([_FORMAT_EFFECT[f] for f in F.CREATIVE_FORMATS])
    ad_quality = rng.normal(0.0, 0.5, A) + adv_quality[ad_adv] + obj_eff[ad_obj] + fmt_eff[ad_fmt]
    ad_conv_q = rng.normal(0.0, 0.3, A)
    ad_bid = np.round(rng.lognormal(0.0, 0.6, A) + 0.05, 4)
    serve_w = ad_bid * rng.lognormal(0.0, 0.5, A)
    ads = _Grouped.build(ad_topic, rng.lognormal(0.0, 0.5, A), T)

    item_topic = rng.integers(0, T, I)
    items = _Grouped.build(item_topic, rng.lognormal(0.0, 1.0, I), T)
    return _World(
        n_topics=T,
        interest_s=s,
        interest_a=a,
        interest_b=b,
        phase=phase,
        user_activity=activity,
        user_device=device,
        user_signup_day=signup,
        user_propensity=propensity,
        ad_advertiser=ad_adv,
        ad_topic=ad_topic,
        ad_objective=ad_obj,
        ad_format=ad_fmt,
        ad_quality=ad_quality,
        ad_conv_quality=ad_conv_q,
        ad_bid=ad_bid,
        ad_serve_p=serve_w / serve_w.sum(),
        ads=ads,
        item_topic=item_topic,
        items=items,
    )


def _get_world(cfg: SimulatorConfig) -> _World:
    return _world(*_world_key(cfg))


def _day_index(date: dt.date) -> int:
    return (date - _EPOCH).days


def _surface_key(name: str) -> int:
    return zlib.crc32(name.encode())


@functools.lru_cache(maxsize=64)
def _surface_params(seed: int, name: str, n_users: int) -> tuple[float, np.ndarray]:
    """Per-surface click bias and per-user surface affinity; keyed by the surface's name only."""
    rng = np.random.default_rng([seed, _surface_key(name), 0xA11])
    lo, hi = _CTR_RANGE
    ctr = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    bias = math.log(ctr / (1 - ctr)) - _LOGIT_OFFSET
    affinity = rng.gamma(0.7, 1.0, n_users)
    return bias, affinity


def user_interests(cfg: SimulatorConfig, date: dt.date) -> np.ndarray:
    """Every user's interest vector on `date`, shape (n_users, n_topics); O(1) in the date."""
    w = _get_world(cfg)
    theta = cfg.interest_drift * _day_index(date) + w.phase
    drift = np.cos(theta)[:, None] * w.interest_a + np.sin(theta)[:, None] * w.interest_b
    return math.sqrt(_RHO) * w.interest_s + math.sqrt(1 - _RHO) * drift


def interest_affinity(
    cfg: SimulatorConfig, date: dt.date, user_ids: np.ndarray, ad_ids: np.ndarray
) -> np.ndarray:
    """Affinity (interest of the user in the ad's topic) on `date`; ids are 1-based as in the data."""
    w = _get_world(cfg)
    u = user_interests(cfg, date)
    return u[np.asarray(user_ids) - 1, w.ad_topic[np.asarray(ad_ids) - 1]]


# ------------------------------------------------------------------------------------------------
# One day of one surface: clean frames
# ------------------------------------------------------------------------------------------------


def _categorical_rows(rng: np.random.Generator, logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    c = np.cumsum(p, axis=1)
    r = rng.random(len(p)) * c[:, -1]
    return np.minimum((c < r[:, None]).sum(axis=1), p.shape[1] - 1)


def _day_times_ms(rng: np.random.Generator, n: int) -> np.ndarray:
    """Milliseconds since midnight, diurnal, sorted."""
    hours = rng.choice(24, n, p=_DIURNAL)
    return np.sort(hours * 3_600_000 + rng.integers(0, 3_600_000, n))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _ts_col(name: str, epoch_ms: np.ndarray, valid: np.ndarray | None = None) -> pl.Series:
    s = pl.Series(name, epoch_ms.astype(np.int64) * 1000, dtype=pl.Int64).cast(F.UTC_US)
    if valid is not None:
        s = s.zip_with(pl.Series(valid, dtype=pl.Boolean), pl.repeat(None, len(s), dtype=F.UTC_US, eager=True))
    return s.alias(name)


def simulate_day_frames(
    cfg: SimulatorConfig, surfaces: SurfacesConfig, surface: str, date: dt.date
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Clean impressions (EVENTS_SCHEMA + p_click, p_conversion) and organic activity
    (USER_ACTIVITY_SCHEMA, source='organic') of one surface on one day."""
    surf = surfaces.get(surface)
    w = _get_world(cfg)
    bias, surf_aff = _surface_params(cfg.seed, surf.name, cfg.n_users)
    day = _day_index(date)
    day0_ms = day * _DAY_MS + (_EPOCH - dt.date(1970, 1, 1)).days * _DAY_MS
    rng = np.random.default_rng([cfg.seed, day, _surface_key(surf.name), 1])
    interests = user_interests(cfg, date)
    user_p = w.user_activity * surf_aff
    user_p = user_p / user_p.sum()
    topic_mask = np.where(w.ads.present, 0.0, -np.inf)
    item_mask = np.where(w.items.present, 0.0, -np.inf)

    # ---- impressions ----
    n = int(rng.poisson(cfg.impressions_per_day * surf.traffic_share))
    t_ms = _day_times_ms(rng, n)
    users = rng.choice(cfg.n_users, n, p=user_p)
    u = interests[users]
    topics = _categorical_rows(rng, _BETA_AD * u + topic_mask)
    ads = np.where(
        rng.random(n) < _TARGETED,
        w.ads.sample(rng, topics),
        rng.choice(len(w.ad_topic), n, p=w.ad_serve_p),
    )
    position = rng.choice(10, n, p=_POSITION_P) + 1
    hour = t_ms // 3_600_000
    device = w.user_device[users]
    aff = u[np.arange(n), w.ad_topic[ads]]
    dev_eff = np.array([_DEVICE_EFFECT[d] for d in F.DEVICES])
    logit = (
        bias
        + w.ad_quality[ads]
        - 0.4 * np.log(position)
        + dev_eff[device]
        + 0.1 * np.cos(2 * np.pi * (hour - 21) / 24)
        + w.user_propensity[users]
        + _GAMMA * aff
    )
    p_click = _sigmoid(logit)
    cvc_base = np.array([_CVC_LOGIT[o] for o in F.OBJECTIVES])
    p_cvc = _sigmoid(cvc_base[w.ad_objective[ads]] + w.ad_conv_quality[ads] + 0.3 * aff)
    click = rng.random(n) < p_click
    conv = click & (rng.random(n) < p_cvc)
    click_delay = np.clip(np.round(rng.lognormal(math.log(20_000), 1.0, n)), 1_000, 1_800_000).astype(np.int64)
    conv_delay = np.round(rng.exponential(2 * 3_600_000, n)).astype(np.int64) + 60_000
    bid = np.round(w.ad_bid[ads] * rng.lognormal(0.0, 0.1, n), 4)
    has_conv = "conversion" in surf.tasks

    imp_ms = day0_ms + t_ms
    click_ms = imp_ms + click_delay
    conv_ms = np.minimum(click_ms + conv_delay, imp_ms + _DAY_MS)
    tenure = np.round(np.maximum(0.0, day + t_ms / _DAY_MS - w.user_signup_day[users]), 3)
    ymd = date.strftime("%Y%m%d")
    imp = pl.DataFrame(
        [
            pl.Series("request_id", [f"{surf.name}-{ymd}-{i:07d}" for i in range(n)], dtype=pl.String),
            _ts_col("ts", imp_ms),
            pl.Series("date", [date] * n, dtype=pl.Date),
            pl.Series("surface", [surf.name] * n, dtype=pl.String),
            pl.Series("domain", [surf.domain] * n, dtype=pl.String),
            pl.Series("user_id", users + 1, dtype=pl.Int64),
            pl.Series("ad_id", ads + 1, dtype=pl.Int64),
            pl.Series("advertiser_id", w.ad_advertiser[ads] + 1, dtype=pl.Int64),
            pl.Series("objective", np.array(F.OBJECTIVES)[w.ad_objective[ads]], dtype=pl.String),
            pl.Series("creative_format", np.array(F.CREATIVE_FORMATS)[w.ad_format[ads]], dtype=pl.String),
            pl.Series("device", np.array(F.DEVICES)[device], dtype=pl.String),
            pl.Series("position", position, dtype=pl.Int32),
            pl.Series("bid", bid, dtype=pl.Float64),
            pl.Series("user_tenure_days", tenure, dtype=pl.Float64),
            pl.Series("hour_of_day", hour, dtype=pl.Int32),
            pl.Series("click", click.astype(np.int8), dtype=pl.Int8),
            _ts_col("click_ts", click_ms, click),
            pl.Series("conversion", conv.astype(np.int8), dtype=pl.Int8)
            if has_conv
            else pl.Series("conversion", [None] * n, dtype=pl.Int8),
            _ts_col("conversion_ts", conv_ms, conv if has_conv else np.zeros(n, bool)),
            pl.Series("p_click", p_click, dtype=pl.Float64),
            pl.Series("p_conversion", p_click * p_cvc if has_conv else [None] * n, dtype=pl.Float64),
        ]
    )

    # ---- organic activity ----
    m = int(rng.poisson(cfg.impressions_per_day * surf.traffic_share * cfg.organic_per_impression))
    o_ms = day0_ms + _day_times_ms(rng, m)
    o_users = rng.choice(cfg.n_users, m, p=user_p)
    o_topics = _categorical_rows(rng, _BETA_ORGANIC * interests[o_users] + item_mask)
    o_items = w.items.sample(rng, o_topics) + cfg.n_ads + 1
    o_action = rng.choice(len(F.ORGANIC_ACTIONS), m, p=_ACTION_P)
    org = pl.DataFrame(
        [
            pl.Series("user_id", o_users + 1, dtype=pl.Int64),
            _ts_col("ts", o_ms),
            pl.Series("date", [date] * m, dtype=pl.Date),
            pl.Series("surface", [surf.name] * m, dtype=pl.String),
            pl.Series("item_id", o_items, dtype=pl.Int64),
            pl.Series("action", np.array(F.ORGANIC_ACTIONS)[o_action], dtype=pl.String),
            pl.Series("source", ["organic"] * m, dtype=pl.String),
        ]
    ).unique(maintain_order=True)  # exact duplicates would be quarantined as duplicate_record
    return imp, org
