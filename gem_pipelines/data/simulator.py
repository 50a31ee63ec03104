"""The embedded default data source: a seeded generative world that writes raw landing files.

The world (users with latent topic interests, advertisers, ads, organic items) derives from the
seed alone. One day of one surface derives from (seed, date, surface) alone, so any partition can
be materialised by itself, in any order, and re-materialising it gives byte-identical files.

Churn (`churn` in simulator.yaml): every day a share of the ads (campaigns of the pool's advertisers),
organic items and users (arriving with no history) is renewed, as a function of (seed, id, date) alone
(see "Churn: slots and generations"); with churn 0 every day's catalogue is the static world.

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
corrupted realistically (see `applicable_reasons`), and `SimulatedPartition.n_corrupted` says how many
records of each quarantine reason the parser should find.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gem_model.config import SimulatorChurn, SimulatorConfig, Surface, SurfacesConfig
from gem_model.store.atomic import write_bytes
from gem_pipelines.data import formats as F

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
_OBJ_EFF = np.array([_OBJECTIVE_EFFECT[o] for o in F.OBJECTIVES])
_FMT_EFF = np.array([_FORMAT_EFFECT[f] for f in F.CREATIVE_FORMATS])
_OWN_OBJECTIVE = 0.8  # share of an advertiser's ads with its own objective
_FORMAT_P = [0.4, 0.3, 0.2, 0.1]  # formats.CREATIVE_FORMATS order
_DEVICE_P = [0.45, 0.4, 0.15]  # formats.DEVICES order
_CVC_LOGIT = {"awareness": -3.4, "traffic": -2.8, "app_installs": -2.0, "conversions": -1.4}
_POSITION_P = np.array([1.0 / p**0.8 for p in range(1, 11)])
_POSITION_P = _POSITION_P / _POSITION_P.sum()
_HOURS = np.arange(24)
_DIURNAL = 1.0 + 0.7 * np.cos(2 * np.pi * (_HOURS - 20) / 24)
_DIURNAL = _DIURNAL / _DIURNAL.sum()
_ACTION_P = np.array([0.55, 0.18, 0.05, 0.04, 0.06, 0.12])  # formats.ORGANIC_ACTIONS order


# --- World --------------------------------------------------------------------------------------


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


_Attrs = dict[str, np.ndarray]  # attribute -> one value per entity


@dataclass(frozen=True)
class _World:
    """The static catalogue: every slot's generation-0 entity (the whole world when churn is 0)."""

    adv_quality: np.ndarray  # (V,)
    adv_objective: np.ndarray  # (V,)
    # per ad slot: advertiser (0-based), topic, objective, format, quality (logit offset incl. advertiser
    # quality), conv_quality, bid, serve_w (untargeted serving weight), weight (within the ad's topic)
    ad: _Attrs
    item: _Attrs  # per organic item slot: topic (0-based), weight (popularity within it)
    # per user slot: interests s, a, b (U, T), phase, activity, device (index into DEVICES), signup (float
    # day index), propensity (logit offset)
    user: _Attrs


def _world_key(cfg: SimulatorConfig) -> tuple[int, ...]:
    return (cfg.seed, cfg.n_users, cfg.n_advertisers, cfg.n_ads, cfg.n_organic_items, cfg.n_topics)


@functools.lru_cache(maxsize=8)
def _world(seed: int, n_users: int, n_advertisers: int, n_ads: int, n_items: int, n_topics: int) -> _World:
    rng = np.random.default_rng([seed, 0x5EED])
    U, T, A, V = n_users, n_topics, n_ads, n_advertisers
    s, a, b = (rng.standard_normal((U, T)) for _ in range(3))
    user = {
        "s": s, "a": a, "b": b, "phase": rng.uniform(0, 2 * np.pi, U), "activity": rng.lognormal(0.0, 0.8, U),
        "device": rng.choice(len(F.DEVICES), U, p=_DEVICE_P), "signup": _REF_DAY - rng.lognormal(5.0, 1.2, U),
        "propensity": rng.normal(0.0, 0.3, U),
    }  # fmt: skip

    adv_quality = rng.normal(0.0, 0.3, V)
    adv_objective = rng.choice(len(F.OBJECTIVES), V, p=[0.2, 0.3, 0.2, 0.3])
    ad_adv = rng.integers(0, V, A)
    ad_adv[: min(A, V)] = rng.permutation(V)[: min(A, V)]  # every advertiser has an ad where possible
    ad_topic = rng.permutation(np.arange(A) % T)
    # most of an advertiser's ads share its objective
    ad_obj = np.where(rng.random(A) < _OWN_OBJECTIVE, adv_objective[ad_adv],
                      rng.integers(0, len(F.OBJECTIVES), A))  # fmt: skip
    ad_fmt = rng.choice(len(F.CREATIVE_FORMATS), A, p=_FORMAT_P)
    ad_quality = rng.normal(0.0, 0.5, A) + adv_quality[ad_adv] + _OBJ_EFF[ad_obj] + _FMT_EFF[ad_fmt]
    ad_conv_q = rng.normal(0.0, 0.3, A)
    ad_bid = np.round(rng.lognormal(0.0, 0.6, A) + 0.05, 4)
    ad = {
        "advertiser": ad_adv, "topic": ad_topic, "objective": ad_obj, "format": ad_fmt, "quality": ad_quality,
        "conv_quality": ad_conv_q, "bid": ad_bid, "serve_w": ad_bid * rng.lognormal(0.0, 0.5, A),
        "weight": rng.lognormal(0.0, 0.5, A),
    }  # fmt: skip
    item = {"topic": rng.integers(0, T, n_items), "weight": rng.lognormal(0.0, 1.0, n_items)}
    return _World(adv_quality, adv_objective, ad, item, user)


def _get_world(cfg: SimulatorConfig) -> _World:
    return _world(*_world_key(cfg))


def _day_index(date: dt.date) -> int:
    return (date - _EPOCH).days


def _day0_ms(date: dt.date) -> int:
    return (date - dt.date(1970, 1, 1)).days * _DAY_MS


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


# --- Churn: slots and generations ---------------------------------------------------------------
# Each kind (ads, organic items, users) has a fixed number of slots; slot k holds one entity at a
# time. Its generation on day t is floor((t - _CHURN_REF) * rate_k + phase_k): generation 0 is the
# static catalogue, each later (or earlier) generation a new entity born the day the generation
# starts and retired the day the next starts. rate_k = min(1, churn * e_k), e_k lognormal with mean
# 1 (short flights and long-running campaigns), so about `churn` of the slots renew a day, and the
# catalogue's size never changes. With churn 0 every slot stays at generation 0 on every day.
# A new entity's attributes are counter-based draws keyed by (seed, kind, slot, generation) alone,
# and its id encodes (slot, generation), so any partition still simulates alone and in O(1) days.

_CHURN_REF = _REF_DAY  # the day every slot holds its generation-0 entity
_LIFETIME_SIGMA = 0.75  # spread of the slots' renewal rates (log scale)
_ADS, _ITEMS, _USERS, _AFFINITY, _SCHEDULE = 0xAD, 0x17E, 0x05E, 0xAFF, 0x5C4  # draw tags
_M64 = 0xFFFF_FFFF_FFFF_FFFF
# Gamma(0.7, 1) of the static users' surface affinity, as a lognormal with its mean and variance
_AFF_SIGMA = math.sqrt(math.log(1 + 1 / 0.7))
_AFF_MU = math.log(0.7) - _AFF_SIGMA**2 / 2


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arithmetic wraps on purpose)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(
    seed: int, tag: int, slot: np.ndarray, gen: np.ndarray | int, field: np.ndarray | int
) -> np.ndarray:
    """U(0, 1) draws keyed by (seed, tag, slot, generation, field) alone; the arrays broadcast."""
    h = _mix(np.asarray(seed & _M64, dtype=np.uint64) ^ np.uint64(tag))
    for part in (slot, gen, field):
        h = _mix(h ^ np.asarray(part, dtype=np.int64).astype(np.uint64))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53


def _normal(
    seed: int, tag: int, slot: np.ndarray, gen: np.ndarray | int, field: np.ndarray | int
) -> np.ndarray:
    """N(0, 1) by Box-Muller from the fields 2 * field and 2 * field + 1."""
    field = np.asarray(field, dtype=np.int64)
    u1, u2 = _uniform(seed, tag, slot, gen, 2 * field), _uniform(seed, tag, slot, gen, 2 * field + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _categorical(u: np.ndarray, p: list[float]) -> np.ndarray:
    return np.minimum(np.searchsorted(np.cumsum(p), u, side="right"), len(p) - 1)


@functools.lru_cache(maxsize=32)
def _schedule(seed: int, tag: int, n_slots: int, churn: float) -> tuple[np.ndarray, np.ndarray]:
    """(rate, phase) of every slot of one kind."""
    slots = np.arange(n_slots)
    e = np.exp(_LIFETIME_SIGMA * _normal(seed, tag ^ _SCHEDULE, slots, 0, 0) - _LIFETIME_SIGMA**2 / 2)
    return np.minimum(1.0, churn * e), _uniform(seed, tag ^ _SCHEDULE, slots, 0, 2)


def _generations(seed: int, tag: int, n_slots: int, churn: float, day: int) -> np.ndarray:
    """Generation of every slot on `day` (all 0 when churn is 0)."""
    if churn == 0:
        return np.zeros(n_slots, dtype=np.int64)
    rate, phase = _schedule(seed, tag, n_slots, churn)
    return np.floor((day - _CHURN_REF) * rate + phase).astype(np.int64)


def _birth_day(
    seed: int, tag: int, n_slots: int, churn: float, slot: np.ndarray, gen: np.ndarray
) -> np.ndarray:
    """First day of each (slot, generation), generation != 0 (churn > 0)."""
    rate, phase = _schedule(seed, tag, n_slots, churn)
    r, f = rate[slot], phase[slot]
    day = _CHURN_REF + np.ceil((gen - f) / r)
    # floating point at the boundaries: step to the first day whose generation is >= gen
    day = np.where(np.floor((day - 1 - _CHURN_REF) * r + f) >= gen, day - 1, day)
    day = np.where(np.floor((day - _CHURN_REF) * r + f) < gen, day + 1, day)
    return day


def _ids(slot: np.ndarray, gen: np.ndarray, stride: int) -> np.ndarray:
    """1-based ids: generation 0 keeps slot + 1 (the static ids), others go above `stride`."""
    z = np.where(gen > 0, 2 * gen - 1, -2 * gen)  # zigzag: 0, 1, -1, 2, ... -> 0, 1, 2, 3, ...
    return stride * z + slot + 1


def _slots(ids: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot, generation) of 1-based ids (the inverse of `_ids`)."""
    ids = np.asarray(ids, dtype=np.int64) - 1
    z, slot = ids // stride, ids % stride
    return slot, np.where(z % 2 == 1, (z + 1) // 2, -(z // 2))


def _renewed(static: _Attrs, slot: np.ndarray, gen: np.ndarray, draw: Callable[..., _Attrs]) -> _Attrs:
    """Entities of (slot, generation): generation 0 from the static world, the others `draw(slot, gen)`."""
    out = {key: values[slot] for key, values in static.items()}  # fancy indexing: copies
    new = gen != 0
    if new.any():
        for key, values in draw(slot[new], gen[new]).items():
            out[key][new] = values
    return out


def _ad_attrs(cfg: SimulatorConfig, slot: np.ndarray, gen: np.ndarray) -> _Attrs:
    """Ads of (slot, generation); a new one is launched by an advertiser of the pool with a new creative,
    objective and target topic."""
    w, seed = _get_world(cfg), cfg.seed

    def draw(k: np.ndarray, g: np.ndarray) -> _Attrs:
        def u(field: int) -> np.ndarray:
            return _uniform(seed, _ADS, k, g, field)

        def z(field: int) -> np.ndarray:
            return _normal(seed, _ADS, k, g, field)

        adv = np.minimum((u(0) * cfg.n_advertisers).astype(np.int64), cfg.n_advertisers - 1)
        obj = np.where(u(1) < _OWN_OBJECTIVE, w.adv_objective[adv], _categorical(u(2), [0.25] * 4))
        fmt = _categorical(u(3), _FORMAT_P)
        bid = np.round(np.exp(0.6 * z(10)) + 0.05, 4)
        return {
            "advertiser": adv, "topic": np.minimum((u(4) * cfg.n_topics).astype(np.int64), cfg.n_topics - 1),
            "objective": obj, "format": fmt,
            "quality": 0.5 * z(11) + w.adv_quality[adv] + _OBJ_EFF[obj] + _FMT_EFF[fmt],
            "conv_quality": 0.3 * z(12), "bid": bid, "serve_w": bid * np.exp(0.5 * z(13)),
            "weight": np.exp(0.5 * z(14)),
        }  # fmt: skip

    return _renewed(w.ad, slot, gen, draw)


def _item_attrs(cfg: SimulatorConfig, slot: np.ndarray, gen: np.ndarray) -> _Attrs:
    return _renewed(_get_world(cfg).item, slot, gen, lambda k, g: {
        "topic": np.minimum((_uniform(cfg.seed, _ITEMS, k, g, 0) * cfg.n_topics).astype(np.int64), cfg.n_topics - 1),
        "weight": np.exp(_normal(cfg.seed, _ITEMS, k, g, 1)),
    })  # fmt: skip


def _user_attrs(cfg: SimulatorConfig, slot: np.ndarray, gen: np.ndarray) -> _Attrs:
    """Users of (slot, generation); a new one arrives on its birth day with fresh interests (no history)."""
    seed, T = cfg.seed, cfg.n_topics

    def draw(k: np.ndarray, g: np.ndarray) -> _Attrs:
        grid = np.arange(T)[None, :]
        return {
            "s": _normal(seed, _USERS, k[:, None], g[:, None], 100 + grid),
            "a": _normal(seed, _USERS, k[:, None], g[:, None], 100 + T + grid),
            "b": _normal(seed, _USERS, k[:, None], g[:, None], 100 + 2 * T + grid),
            "phase": 2 * np.pi * _uniform(seed, _USERS, k, g, 0),
            "activity": np.exp(0.8 * _normal(seed, _USERS, k, g, 1)),
            "device": _categorical(_uniform(seed, _USERS, k, g, 4), _DEVICE_P),
            "signup": _birth_day(seed, _USERS, cfg.n_users, cfg.churn.users, k, g).astype(np.float64),
            "propensity": 0.3 * _normal(seed, _USERS, k, g, 3),
        }

    return _renewed(_get_world(cfg).user, slot, gen, draw)


@dataclass(frozen=True)
class _Day:
    """The catalogue alive on one day, indexed by slot (the static world's arrays when nothing churned)."""

    ad_ids: np.ndarray
    ad: _Attrs
    ad_serve_p: np.ndarray  # untargeted serving distribution
    ads: _Grouped
    item_ids: np.ndarray
    item_topic: np.ndarray
    items: _Grouped
    user_ids: np.ndarray
    user: _Attrs


def _day_catalogue(cfg: SimulatorConfig, day: int) -> _Day:
    return _catalogue(*_world_key(cfg), cfg.churn, day)


@functools.lru_cache(maxsize=16)
def _catalogue(seed: int, n_users: int, n_advertisers: int, n_ads: int, n_items: int, n_topics: int,
               churn: SimulatorChurn, day: int) -> _Day:  # fmt: skip
    cfg = SimulatorConfig(seed=seed, n_users=n_users, n_advertisers=n_advertisers, n_ads=n_ads,
                          n_organic_items=n_items, n_topics=n_topics, churn=churn)  # fmt: skip
    stride = n_ads + n_items
    a_slot, i_slot, u_slot = np.arange(n_ads), np.arange(n_items), np.arange(n_users)
    a_gen = _generations(seed, _ADS, n_ads, churn.ads, day)
    i_gen = _generations(seed, _ITEMS, n_items, churn.organic_items, day)
    u_gen = _generations(seed, _USERS, n_users, churn.users, day)
    ad = _ad_attrs(cfg, a_slot, a_gen)
    items = _item_attrs(cfg, i_slot, i_gen)
    return _Day(
        ad_ids=_ids(a_slot, a_gen, stride),
        ad=ad,
        ad_serve_p=ad["serve_w"] / ad["serve_w"].sum(),
        ads=_Grouped.build(ad["topic"], ad["weight"], n_topics),
        item_ids=_ids(n_ads + i_slot, i_gen, stride),
        item_topic=items["topic"],
        items=_Grouped.build(items["topic"], items["weight"], n_topics),
        user_ids=_ids(u_slot, u_gen, n_users),
        user=_user_attrs(cfg, u_slot, u_gen),
    )


@functools.lru_cache(maxsize=64)
def _surface_affinity(seed: int, name: str, n_users: int, user_churn: float, day: int) -> np.ndarray:
    """Every user slot's affinity for the surface on `day` (generation 0: the static draw)."""
    static = {"affinity": _surface_params(seed, name, n_users)[1]}
    gen = _generations(seed, _USERS, n_users, user_churn, day)
    tag = _AFFINITY ^ (_surface_key(name) << 12)
    return _renewed(static, np.arange(n_users), gen, lambda k, g: {
        "affinity": np.exp(_AFF_MU + _AFF_SIGMA * _normal(seed, tag, k, g, 0))
    })["affinity"]  # fmt: skip


def _interests(cfg: SimulatorConfig, user: _Attrs, date: dt.date) -> np.ndarray:
    theta = cfg.interest_drift * _day_index(date) + user["phase"]
    drift = np.cos(theta)[:, None] * user["a"] + np.sin(theta)[:, None] * user["b"]
    return math.sqrt(_RHO) * user["s"] + math.sqrt(1 - _RHO) * drift


@dataclass(frozen=True)
class Catalogue:
    """Ids alive on one day (the truth behind the logs; reports derive ages from `events` alone)."""

    ad_ids: np.ndarray
    item_ids: np.ndarray
    user_ids: np.ndarray


def active_catalogue(cfg: SimulatorConfig, date: dt.date) -> Catalogue:
    """The ads, organic items and users that can appear on `date`."""
    c = _day_catalogue(cfg, _day_index(date))
    return Catalogue(c.ad_ids.copy(), c.item_ids.copy(), c.user_ids.copy())


def topics_of(cfg: SimulatorConfig, ids: np.ndarray) -> np.ndarray:
    """The true topic of ad or organic item ids (any generation), for diagnostics."""
    slot, gen = _slots(ids, cfg.n_ads + cfg.n_organic_items)
    is_ad = slot < cfg.n_ads
    out = np.empty(len(slot), dtype=np.int64)
    out[is_ad] = _ad_attrs(cfg, slot[is_ad], gen[is_ad])["topic"]
    out[~is_ad] = _item_attrs(cfg, slot[~is_ad] - cfg.n_ads, gen[~is_ad])["topic"]
    return out


def window_topics(
    cfg: SimulatorConfig, dates: list[dt.date]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ad ids, their topics, organic item ids, their topics) of every ad and item alive on any of
    `dates`, sorted by id: the truth no model reads, for diagnostics (bench/item_topics.py)."""
    cats = [active_catalogue(cfg, d) for d in dates]
    ads = np.unique(np.concatenate([c.ad_ids for c in cats]))
    items = np.unique(np.concatenate([c.item_ids for c in cats]))
    return ads, topics_of(cfg, ads), items, topics_of(cfg, items)


def user_propensity(cfg: SimulatorConfig, user_ids: np.ndarray) -> np.ndarray:
    """The users' click propensity (a logit offset), for diagnostics."""
    return _user_attrs(cfg, *_slots(user_ids, cfg.n_users))["propensity"]


def interest_affinity(
    cfg: SimulatorConfig, date: dt.date, user_ids: np.ndarray, ad_ids: np.ndarray
) -> np.ndarray:
    """Affinity (interest of the user in the ad's topic) on `date`; ids are 1-based as in the data."""
    u = _interests(cfg, _user_attrs(cfg, *_slots(user_ids, cfg.n_users)), date)
    topic = topics_of(cfg, ad_ids)
    return u[np.arange(len(u)), topic]


# --- One day of one surface: clean frames -------------------------------------------------------


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


_IMP_SCHEMA = {**F.EVENTS_SCHEMA, "p_click": pl.Float64, "p_conversion": pl.Float64}


def simulate_day_frames(
    cfg: SimulatorConfig, surfaces: SurfacesConfig, surface: str, date: dt.date
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Clean impressions (EVENTS_SCHEMA + p_click, p_conversion) and organic activity
    (USER_ACTIVITY_SCHEMA, source='organic') of one surface on one day."""
    surf = surfaces.get(surface)
    day = _day_index(date)
    c = _day_catalogue(cfg, day)  # the ads, items and users alive today, by slot
    ad, user = c.ad, c.user
    bias = _surface_params(cfg.seed, surf.name, cfg.n_users)[0]
    surf_aff = _surface_affinity(cfg.seed, surf.name, cfg.n_users, cfg.churn.users, day)
    day0_ms = _day0_ms(date)
    rng = np.random.default_rng([cfg.seed, day, _surface_key(surf.name), 1])
    interests = _interests(cfg, user, date)
    user_p = user["activity"] * surf_aff
    user_p = user_p / user_p.sum()
    topic_mask = np.where(c.ads.present, 0.0, -np.inf)
    item_mask = np.where(c.items.present, 0.0, -np.inf)

    # ---- impressions ----
    n = int(rng.poisson(cfg.impressions_per_day * cfg.share(surf)))
    t_ms = _day_times_ms(rng, n)
    users = rng.choice(cfg.n_users, n, p=user_p)
    u = interests[users]
    topics = _categorical_rows(rng, _BETA_AD * u + topic_mask)
    ads = np.where(
        rng.random(n) < _TARGETED,
        c.ads.sample(rng, topics),
        rng.choice(len(c.ad_ids), n, p=c.ad_serve_p),
    )
    position = rng.choice(10, n, p=_POSITION_P) + 1
    hour = t_ms // 3_600_000
    device = user["device"][users]
    aff = u[np.arange(n), ad["topic"][ads]]
    dev_eff = np.array([_DEVICE_EFFECT[d] for d in F.DEVICES])
    logit = (
        bias
        + ad["quality"][ads]
        - 0.4 * np.log(position)
        + dev_eff[device]
        + 0.1 * np.cos(2 * np.pi * (hour - 21) / 24)
        + user["propensity"][users]
        + _GAMMA * aff
    )
    p_click = _sigmoid(logit)
    cvc_base = np.array([_CVC_LOGIT[o] for o in F.OBJECTIVES])
    p_cvc = _sigmoid(cvc_base[ad["objective"][ads]] + ad["conv_quality"][ads] + 0.3 * aff)
    click = rng.random(n) < p_click
    conv = click & (rng.random(n) < p_cvc)
    click_delay = np.clip(np.round(rng.lognormal(math.log(20_000), 1.0, n)), 1_000, 1_800_000).astype(
        np.int64
    )
    conv_delay = np.round(rng.exponential(2 * 3_600_000, n)).astype(np.int64) + 60_000
    bid = np.round(ad["bid"][ads] * rng.lognormal(0.0, 0.1, n), 4)
    has_conv = "conversion" in surf.tasks

    imp_ms = day0_ms + t_ms
    click_ms = imp_ms + click_delay
    conv_ms = np.minimum(click_ms + conv_delay, imp_ms + _DAY_MS)
    tenure = np.round(np.maximum(0.0, day + t_ms / _DAY_MS - user["signup"][users]), 3)
    ymd = date.strftime("%Y%m%d")
    imp = pl.DataFrame({
        "request_id": [f"{surf.name}-{ymd}-{i:07d}" for i in range(n)], "ts": imp_ms, "user_id": c.user_ids[users],
        "ad_id": c.ad_ids[ads], "advertiser_id": ad["advertiser"][ads] + 1,
        "objective": np.array(F.OBJECTIVES)[ad["objective"][ads]],
        "creative_format": np.array(F.CREATIVE_FORMATS)[ad["format"][ads]], "device": np.array(F.DEVICES)[device],
        "position": position, "bid": bid, "user_tenure_days": tenure, "hour_of_day": hour, "click": click,
        "click_ts": click_ms, "conversion": conv, "conversion_ts": conv_ms, "p_click": p_click,
        "p_conversion": p_click * p_cvc,
    }).with_columns(  # times in epoch us; no conversion labels where the surface does not log them
        pl.col("ts") * 1000,
        click_ts=pl.when("click").then(pl.col("click_ts") * 1000),
        conversion_ts=pl.when(pl.lit(has_conv) & pl.col("conversion")).then(pl.col("conversion_ts") * 1000),
        conversion=pl.when(has_conv).then("conversion"), p_conversion=pl.when(has_conv).then("p_conversion"),
        date=pl.lit(date), surface=pl.lit(surf.name), domain=pl.lit(surf.domain),
    ).select(*F.EVENTS_SCHEMA, "p_click", "p_conversion").cast(_IMP_SCHEMA)  # fmt: skip

    # ---- organic activity ----
    m = int(rng.poisson(cfg.impressions_per_day * cfg.share(surf) * cfg.organic_per_impression))
    o_ms = day0_ms + _day_times_ms(rng, m)
    o_users = rng.choice(cfg.n_users, m, p=user_p)
    o_topics = _categorical_rows(rng, _BETA_ORGANIC * interests[o_users] + item_mask)
    o_items = c.item_ids[c.items.sample(rng, o_topics)]
    o_action = rng.choice(len(F.ORGANIC_ACTIONS), m, p=_ACTION_P)
    # unique: exact duplicates would be quarantined as duplicate_record
    org = pl.DataFrame({
        "user_id": c.user_ids[o_users], "ts": o_ms * 1000, "date": [date] * m, "surface": [surf.name] * m,
        "item_id": o_items, "action": np.array(F.ORGANIC_ACTIONS)[o_action], "source": ["organic"] * m,
    }).cast(F.USER_ACTIVITY_SCHEMA).unique(maintain_order=True)  # type: ignore[arg-type]  # fmt: skip
    return imp, org


# --- Raw records in each surface's native format ------------------------------------------------

_IN_PLACE = ("unparseable", "truncated", "missing_id", "bad_type", "out_of_range_value", "out_of_range_ts",
             "unknown_enum")  # fmt: skip
_UNKNOWN_ENUMS = {"objective": "brand_lift", "creative_format": "hologram", "device": "smart_fridge",
                  "action": "poke"}  # fmt: skip
_GARBAGE = ("<html><body><h1>502 Bad Gateway</h1></body></html>", "ERROR upstream timeout (retry 3/3)",
            "\\x00\\x00\\x1f\\x8b garbage", "null null null")  # fmt: skip


def applicable_reasons(surface: Surface) -> tuple[str, ...]:
    """Quarantine reasons the simulator injects for this surface (a subset of formats.REASON_CODES)."""
    if surface.format == "parquet":  # columnar: rows always parse and are typed
        out = ["missing_id", "out_of_range_value", "out_of_range_ts", "unknown_enum", "duplicate_record"]
    else:
        out = list(_IN_PLACE) + ["duplicate_record"]
    if surface.format == "event_stream":
        out.append("orphan_event")
    if "conversion" not in surface.tasks:
        out.append("unexpected_label")
    return tuple(out)


def _iso(expr: pl.Expr) -> pl.Expr:
    return expr.dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")


def _epoch_s(expr: pl.Expr) -> pl.Expr:
    return (expr.dt.epoch("ms") / 1000.0).round(3)


def _ms(expr: pl.Expr) -> pl.Expr:
    return expr.dt.epoch("ms")


def _iso_from_ms(ms: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _ms_from_iso(s: str) -> int:
    t = dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    return round(t.timestamp() * 1000)


# a record's time as each format writes it: (epoch ms of the written value, written value of epoch ms)
_TS_CODECS = {
    "jsonl_nested": (_ms_from_iso, _iso_from_ms),
    "event_stream": (lambda v: round(float(v) * 1000), lambda ms: ms / 1000.0),
    "csv_ms": (int, lambda ms: ms),
    "parquet": (lambda v: int(v) // 1000, lambda ms: ms * 1000),  # epoch microseconds
}


@dataclass
class _Doc:
    """The raw records of one partition, before serialisation; what corruption operates on.

    `files[f]` is a list of records (text lines, or row indices into `cols[f]` for parquet);
    `kinds[f][i]` is "imp" (impression, corruptible in place), "imp_ev" (event_stream impression
    with click/conversion events: never corrupted in place, so no events are orphaned), "org",
    "click" or "conv"; `ts_ms[f][i]` its time.
    """

    names: list[str]
    files: list[list]
    kinds: list[list[str]]
    ts_ms: list[list[int]]
    rids: list[list[str | None]]
    headers: list[str | None]
    cols: list[dict[str, list]] | None = None


_JSON_FORMATS = ("jsonl_nested", "event_stream")
_DELETE = object()  # remove the field (JSON) / leave it empty (CSV) / null (parquet)


class _Rec:
    """One record opened for mutation, addressed by staging field names (formats.RECORD_FIELDS)."""

    def __init__(self, doc: _Doc, fmt: str, f: int, i: int):
        self.doc, self.fmt, self.f, self.i = doc, fmt, f, i
        self.kind = "imp" if doc.kinds[f][i] in ("imp", "imp_ev") else doc.kinds[f][i]
        self.fields = F.RECORD_FIELDS[fmt]["impression" if self.kind == "imp" else "organic"]
        if fmt in _JSON_FORMATS:
            self.obj = json.loads(doc.files[f][i])
        elif fmt == "csv_ms":
            self.obj = dict(zip(doc.headers[f].split(","), doc.files[f][i].split(","), strict=True))
        else:
            self.obj = {c: v[doc.files[f][i]] for c, v in doc.cols[f].items()}

    def has(self, field: str) -> bool:
        return field in self.fields

    def get(self, field: str):
        d = self.obj
        for k in self.fields[field]:
            d = d.get(k) if isinstance(d, dict) else None
        return d

    def set(self, field: str, value) -> None:
        *parents, key = self.fields[field]
        d = self.obj
        for k in parents:
            d = d[k]
        if value is _DELETE and self.fmt in _JSON_FORMATS:
            d.pop(key, None)
        elif self.fmt == "csv_ms":  # text, empty for null
            value = int(value) if isinstance(value, bool) else value
            d[key] = "" if value is _DELETE or value is None else str(value)
        else:
            d[key] = None if value is _DELETE else value

    def get_ms(self, field: str) -> int | None:
        v = self.get(field)
        return None if v is None or v == "" else _TS_CODECS[self.fmt][0](v)

    def set_ms(self, field: str, ms: int) -> None:
        self.set(field, _TS_CODECS[self.fmt][1](ms))

    def dump(self) -> None:
        if self.fmt in _JSON_FORMATS:
            self.doc.files[self.f][self.i] = json.dumps(self.obj, separators=(",", ":"))
        elif self.fmt == "csv_ms":
            self.doc.files[self.f][self.i] = ",".join(self.obj.values())
        else:
            row = self.doc.files[self.f][self.i]
            for c, v in self.obj.items():
                self.doc.cols[self.f][c][row] = v


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


# reason -> ((field, value) choices for an organic record, the same for an impression)
_FIELD_VALUES = {
    "missing_id": ([("user_id", None), ("item_id", _DELETE), ("item_id", None)],
                   [("request_id", ""), ("request_id", _DELETE), ("user_id", None), ("ad_id", _DELETE),
                    ("advertiser_id", None)]),
    "bad_type": ([("item_id", "12a"), ("user_id", "user-17")], [("bid", "abc"), ("position", "2.5x"), ("position", 2.5)]),
}  # fmt: skip


def _mutate(rec: _Rec, reason: str, rng: np.random.Generator) -> None:
    """Apply one in-place corruption (other than unparseable/truncated) to a parsed record."""
    imp = rec.kind == "imp"
    if reason in _FIELD_VALUES:
        field, value = _pick(rng, _FIELD_VALUES[reason][imp])
        if reason == "missing_id" and rec.fmt == "parquet" and field == "request_id":
            value = _pick(rng, ["", None])
        rec.set(field, value)
    elif reason == "out_of_range_value":
        field = "bid" if rng.random() < 0.75 else "user_tenure_days"
        v = float(rec.get(field))
        rec.set(field, -round(abs(v) + 0.5, 4))
    elif reason == "out_of_range_ts":
        shift = int(_pick(rng, [-3, -2, -1, 1, 2, 3])) * _DAY_MS
        for field in ("ts", "click_ts", "conversion_ts"):
            if rec.has(field) and (ms := rec.get_ms(field)) is not None:
                rec.set_ms(field, ms + shift)
    elif reason == "unknown_enum":
        field = _pick(rng, ["objective", "creative_format", "device"]) if imp else "action"
        rec.set(field, _UNKNOWN_ENUMS[field])
    else:  # unexpected_label: a conversion on a surface that does not log conversions
        rec.set("conversion", True)
        base = rec.get_ms("click_ts") or rec.get_ms("ts")
        rec.set_ms("conversion_ts", base + 900_000)
    rec.dump()


def _truncate(line: str, fmt: str, rng: np.random.Generator) -> str:
    if fmt == "csv_ms":  # cut before the last delimiter: fewer fields than the header
        last = line.rfind(",")
        return line[: int(rng.integers(max(1, last // 3), last))]
    for _ in range(100):
        cut = int(rng.integers(len(line) // 4, len(line) - 1))
        if line[cut - 1] not in "}":
            return line[:cut]
    return line[: len(line) // 2] + '"'


def _unparseable(line: str, fmt: str, rng: np.random.Generator) -> str:
    if fmt == "csv_ms":  # an unescaped delimiter: more fields than the header
        fields = line.split(",")
        k = int(rng.integers(len(fields)))
        fields[k] = fields[k] + "," + _pick(rng, ["desktop", "n/a", "1;2", "x"])
        return ",".join(fields)
    choice = int(rng.integers(3))
    if choice == 0:  # broken quoting: drop a quote in the middle
        quotes = [k for k, c in enumerate(line) if c == '"']
        k = quotes[int(rng.integers(1, len(quotes) - 1))]
        out = line[:k] + line[k + 1 :]
    elif choice == 1:  # a key/value separator mangled
        colons = [k for k, c in enumerate(line) if c == ":" and line[k - 1] == '"']
        k = colons[int(rng.integers(len(colons)))]
        out = line[:k] + "=" + line[k + 1 :]
    else:  # not JSON at all (tagged so that two garbage lines are not copies of each other)
        out = f"{_pick(rng, _GARBAGE)} [{int(rng.integers(1 << 40)):x}]"
    try:
        json.loads(out)
    except ValueError:
        return out
    return f"{_GARBAGE[0]} [{int(rng.integers(1 << 40)):x}]"  # pragma: no cover


def _plan(rng: np.random.Generator, n_records: int, reasons: tuple[str, ...], rate: float) -> dict[str, int]:
    counts = dict.fromkeys(reasons, 0)
    if rate <= 0 or not reasons or n_records == 0:
        return counts
    k = int(rng.binomial(n_records, rate))
    if n_records >= 1000:  # every reason at least once, so quarantine is always exercised
        counts = dict.fromkeys(reasons, 1)
        k = max(0, k - len(reasons))
    for j in rng.integers(0, len(reasons), k):
        counts[reasons[int(j)]] += 1
    return counts


def _corrupt(doc: _Doc, surf: Surface, date: dt.date, n_imp: int, rate: float, rng: np.random.Generator
             ) -> dict[str, int]:  # fmt: skip
    """Corrupt `doc` in place; extra records are inserted. Returns reason -> injected count."""
    fmt = surf.format
    reasons = applicable_reasons(surf)
    n_records = sum(len(f) for f in doc.files)
    counts = _plan(rng, n_records, reasons, rate)
    if not any(counts.values()):
        return counts
    file_of = np.concatenate([np.full(len(ks), f) for f, ks in enumerate(doc.kinds)])
    index_of = np.concatenate([np.arange(len(ks)) for ks in doc.kinds])
    kind_of = np.concatenate([np.asarray(ks, dtype=object) for ks in doc.kinds])
    pools: dict[tuple[str, ...], np.ndarray] = {}
    used: set[int] = set()

    def take(kinds: tuple[str, ...]) -> tuple[int, int] | None:
        if kinds not in pools:
            pools[kinds] = np.flatnonzero(np.isin(kind_of, kinds))
        pool = pools[kinds]
        if not len(pool):
            return None
        for _ in range(1000):
            if (j := int(pool[int(rng.integers(len(pool)))])) not in used:
                used.add(j)
                return int(file_of[j]), int(index_of[j])
        return None

    injected = dict.fromkeys(reasons, 0)
    extras: list[tuple[int, float, object]] = []  # (file, position key, record)
    for reason in reasons:
        in_place = reason in _IN_PLACE or (reason == "unexpected_label" and fmt != "event_stream")
        if in_place:  # the kinds of record the reason applies to
            kinds = ("imp",) if reason in ("out_of_range_value", "unexpected_label") else ("imp", "org")
        else:
            kinds = {"duplicate_record": ("imp", "imp_ev", "org", "click", "conv"), "orphan_event": ()}.get(
                reason, ("imp", "imp_ev"))  # fmt: skip
        for _ in range(counts[reason]):
            if (at := take(kinds) if kinds else (0, 0)) is None:  # an orphan event is a new record
                continue
            f, i = at
            if reason == "truncated":
                doc.files[f][i] = _truncate(doc.files[f][i], fmt, rng)
            elif reason == "unparseable":
                doc.files[f][i] = _unparseable(doc.files[f][i], fmt, rng)
            elif in_place:
                _mutate(_Rec(doc, fmt, f, i), reason, rng)
            elif reason == "duplicate_record":  # an exact later copy
                pos = min(i + 1 + int(rng.integers(0, 200)), len(doc.files[f])) - 0.5
                extras.append((f, pos, doc.files[f][i]))  # a line, or (parquet) the row index again
            else:  # orphan_event, or event_stream's unexpected_label: an extra event
                if reason == "orphan_event":
                    rid = f"{surf.name}-{date:%Y%m%d}-{n_imp + 1 + injected[reason]:07d}"
                    ms = _day0_ms(date) + int(rng.integers(0, _DAY_MS))
                    event = _pick(rng, ["click", "click", "conversion"] if "conversion" in surf.tasks
                                  else ["click"])  # fmt: skip
                else:
                    rid, ms = doc.rids[f][i], doc.ts_ms[f][i] + int(rng.integers(60_000, 3_600_000))
                    event = "conversion"
                line = json.dumps(
                    {"event": event, "request_id": rid, "ts": ms / 1000.0}, separators=(",", ":")
                )
                pos = float(np.searchsorted(np.asarray(doc.ts_ms[0]), ms, side="right")) - 0.5
                extras.append((0, pos, line))
            injected[reason] += 1
    for f in range(len(doc.files)):  # extras sit at half positions, records at whole ones: sort them together
        if mine := [(pos, seq, rec) for seq, (ff, pos, rec) in enumerate(extras, 1) if ff == f]:
            merged = sorted([(i, 0, rec) for i, rec in enumerate(doc.files[f])] + mine, key=lambda t: t[:2])
            doc.files[f] = [rec for _, _, rec in merged]
    return injected


def _lines(df: pl.DataFrame, kind: pl.Expr, ts: pl.Expr, rid: pl.Expr, record: pl.Expr) -> pl.DataFrame:
    return df.select(
        ts.alias("ts_ms"),
        kind.alias("kind"),
        rid.cast(pl.String).alias("rid"),
        record.struct.json_encode().alias("line"),
    )


_WRITE_TS = {"jsonl_nested": _iso, "event_stream": _epoch_s, "csv_ms": _ms, "parquet": lambda e: e}


def _values(fmt: str, kind: str, label: str | None = None) -> dict[str, pl.Expr]:
    """Each field of `kind` records (formats.RECORD_FIELDS) as `fmt` writes it; `label`: their kind field."""
    out = {}
    for name in F.RECORD_FIELDS[fmt][kind]:
        e = pl.col(name)
        if name == "kind":
            e = pl.lit(label)
        elif name == "ts" or name.endswith("_ts"):
            e = _WRITE_TS[fmt](e)
        elif name in ("click", "conversion") and fmt != "csv_ms":  # CSV writes 0/1
            e = e.cast(pl.Boolean)
        out[name] = e
    return out


def _record(fmt: str, kind: str, label: str) -> pl.Expr:
    """A JSON format's record: its fields' values nested at their paths."""
    values = _values(fmt, kind, label)

    def nest(tree: dict) -> pl.Expr:
        return pl.struct(*((nest(v) if isinstance(v, dict) else values[v]).alias(k) for k, v in tree.items()))

    return nest(F.path_tree(F.RECORD_FIELDS[fmt][kind]))


def _build_json(fmt: str, imp: pl.DataFrame, org: pl.DataFrame) -> _Doc:
    c, stream = pl.col, fmt == "event_stream"
    has_events = pl.lit(stream) & ((c.click == 1) | (c.conversion == 1).fill_null(False))
    imp_kind = pl.when(has_events).then(pl.lit("imp_ev")).otherwise(pl.lit("imp"))  # see _Doc
    impression = _record(fmt, "impression", "impression" if stream else "ad")
    parts = [_lines(imp, imp_kind, _ms(c.ts), c.request_id, impression)]
    for label, kind in (("click", "click"), ("conversion", "conv")) if stream else ():
        sub = imp.filter(pl.col(label) == 1)
        event = pl.struct(
            pl.lit(label).alias("event"), c.request_id, _epoch_s(pl.col(f"{label}_ts")).alias("ts")
        )
        parts.append(_lines(sub, pl.lit(kind), _ms(pl.col(f"{label}_ts")), c.request_id, event))
    parts.append(_lines(org, pl.lit("org"), _ms(c.ts), pl.lit(None), _record(fmt, "organic", "organic")))
    df = pl.concat(parts).sort("ts_ms", maintain_order=True)
    return _Doc([F.LANDING_FILES[fmt][0]], [df["line"].to_list()], [df["kind"].to_list()], [df["ts_ms"].to_list()],
                [df["rid"].to_list()], [None])  # fmt: skip


def _build_flat(fmt: str, imp: pl.DataFrame, org: pl.DataFrame) -> _Doc:
    """csv_ms: lines of text; parquet: rows of columns (timestamps as epoch us while mutating)."""
    doc = _Doc(list(F.LANDING_FILES[fmt]), [], [], [], [], [], [] if fmt == "parquet" else None)
    for df, kind, short in ((imp, "impression", "imp"), (org, "organic", "org")):
        fields = F.RECORD_FIELDS[fmt][kind]
        values = _values(fmt, kind).values()
        df = df.select(**{loc: e for (loc,), e in zip(fields.values(), values, strict=True)})
        if doc.cols is None:
            text = df.write_csv(null_value="", line_terminator="\n")
            header, *lines = text.rstrip("\n").split("\n")
            doc.files.append(lines)
            doc.headers.append(header)
            doc.ts_ms.append(df[fields["ts"][0]].to_list())
        else:
            df = df.with_columns(pl.col(pl.Datetime).dt.epoch("us"))
            doc.cols.append(df.to_dict(as_series=False))
            doc.files.append(list(range(len(df))))
            doc.headers.append(None)
            doc.ts_ms.append([v // 1000 for v in doc.cols[-1]["ts"]])
        doc.kinds.append([short] * len(df))
        doc.rids.append(df[fields["request_id"][0]].to_list() if kind == "impression" else [None] * len(df))
    return doc


# the lake's types, with the 0/1 labels (Int8) as booleans
_ARROW = {pl.String: pa.string(), pl.Int64: pa.int64(), pl.Int32: pa.int32(), pl.Float64: pa.float64(),
          pl.Int8: pa.bool_(), F.UTC_US: pa.timestamp("us", "UTC")}  # fmt: skip
_PARQUET_SCHEMAS = {
    name: pa.schema([(c, _ARROW[schema[c]]) for c in F.RECORD_FIELDS["parquet"][kind]])
    for name, kind, schema in (("impressions.parquet", "impression", F.EVENTS_SCHEMA),
                               ("activity.parquet", "organic", F.USER_ACTIVITY_SCHEMA))
}  # fmt: skip


def _serialise(doc: _Doc) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for f, name in enumerate(doc.names):
        if doc.cols is None:
            lines = ([doc.headers[f]] if doc.headers[f] is not None else []) + doc.files[f]
            out[name] = ("\n".join(lines) + "\n").encode() if lines else b""
            continue
        schema, cols, rows = _PARQUET_SCHEMAS[name], doc.cols[f], doc.files[f]
        arrays = [  # timestamps are epoch us while mutating
            pa.array(
                [cols[c.name][r] for r in rows], pa.int64() if pa.types.is_timestamp(c.type) else c.type
            ).cast(c.type)
            for c in schema
        ]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), sink, compression="zstd")
        out[name] = sink.getvalue().to_pybytes()
    return out


def _write_atomic(directory: Path, blobs: dict[str, bytes]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [write_bytes(directory / name, data) for name, data in blobs.items()]
    for stale in directory.iterdir():  # leftovers of an earlier simulation of this partition
        if stale.name not in blobs and stale.is_file():
            stale.unlink()
    return paths


@dataclass(frozen=True)
class SimulatedPartition:
    surface: str
    date: dt.date
    files: list[Path]  # raw files written
    oracle: pl.DataFrame  # formats.ORACLE_SCHEMA, one row per drawn impression (corrupted ones too)
    n_impressions: int
    n_organic: int
    n_click_events: int
    n_conversion_events: int
    n_corrupted: dict[str, int]  # reason code -> injected count (what the parser should quarantine)

    @property
    def n_raw_records(self) -> int:
        """Raw records written: lines (without CSV headers) or parquet rows, corrupted and extra ones too."""
        n = self.n_corrupted.get
        events = self.n_click_events + self.n_conversion_events + n("unexpected_label", 0)
        separate_events = any(p.name == "events.jsonl" for p in self.files)  # event_stream
        extra = n("duplicate_record", 0) + n("orphan_event", 0) + (events if separate_events else 0)
        return self.n_impressions + self.n_organic + extra


def simulate_partition(
    cfg: SimulatorConfig, surfaces: SurfacesConfig, surface: str, date: dt.date, landing_root: Path
) -> SimulatedPartition:
    """Simulate one day of one surface and write its raw files to `landing_root/<surface>/<date>/`
    (replacing what was there). Deterministic in (cfg, surface, date) alone."""
    surf = surfaces.get(surface)
    imp, org = simulate_day_frames(cfg, surfaces, surface, date)
    doc = (_build_json if surf.format in _JSON_FORMATS else _build_flat)(surf.format, imp, org)
    rng = np.random.default_rng([cfg.seed, _day_index(date), _surface_key(surf.name), 2])
    n_corrupted = _corrupt(doc, surf, date, len(imp), cfg.corruption_rate, rng)
    files = _write_atomic(Path(landing_root) / surf.name / date.isoformat(), _serialise(doc))
    oracle = imp.select(list(F.ORACLE_SCHEMA)).cast(F.ORACLE_SCHEMA)
    return SimulatedPartition(
        surface=surf.name,
        date=date,
        files=files,
        oracle=oracle,
        n_impressions=len(imp),
        n_organic=len(org),
        n_click_events=int(imp["click"].sum()),
        n_conversion_events=int(imp["conversion"].sum()),  # all null (0) where not logged
        n_corrupted=n_corrupted,
    )
