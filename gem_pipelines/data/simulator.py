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
corrupted realistically (`gem_pipelines.data.raw_records`), and `SimulatedPartition.n_corrupted` says how
many records of each quarantine reason the parser should find.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from gem_model.config import SimulatorChurn, SimulatorConfig, SurfacesConfig
from gem_pipelines.data import formats as F
from gem_pipelines.data import raw_records
from gem_pipelines.data.raw_records import DAY_MS, day0_ms

_EPOCH = dt.date(2020, 1, 1)
_REF_DAY = (dt.date(2026, 1, 1) - _EPOCH).days  # users' signup days are drawn before this day

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


def ad_own_quality(cfg: SimulatorConfig, ad_ids: np.ndarray, date: dt.date) -> tuple[np.ndarray, np.ndarray]:
    """(each ad's own quality draw: its logit offset less its advertiser's quality and its objective's and
    format's effects; whether it was launched on `date`), for diagnostics: what no log says of an ad on its
    first day but its own clicks of that day."""
    slot, gen = _slots(ad_ids, cfg.n_ads + cfg.n_organic_items)
    a = _ad_attrs(cfg, slot, gen)
    own = a["quality"] - _get_world(cfg).adv_quality[a["advertiser"]] - _OBJ_EFF[a["objective"]] - _FMT_EFF[a["format"]]
    born = np.zeros(len(slot), dtype=bool)
    if cfg.churn.ads > 0 and (new := gen != 0).any():
        born[new] = _birth_day(cfg.seed, _ADS, cfg.n_ads, cfg.churn.ads, slot[new], gen[new]) == _day_index(date)
    return own, born


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
    start_ms = day0_ms(date)
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

    imp_ms = start_ms + t_ms
    click_ms = imp_ms + click_delay
    conv_ms = np.minimum(click_ms + conv_delay, imp_ms + DAY_MS)
    tenure = np.round(np.maximum(0.0, day + t_ms / DAY_MS - user["signup"][users]), 3)
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
    o_ms = start_ms + _day_times_ms(rng, m)
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
    doc = raw_records.build(surf.format, imp, org)
    rng = np.random.default_rng([cfg.seed, _day_index(date), _surface_key(surf.name), 2])
    n_corrupted = raw_records.corrupt(doc, surf, date, len(imp), cfg.corruption_rate, rng)
    files = raw_records.write_atomic(Path(landing_root) / surf.name / date.isoformat(), raw_records.serialise(doc))
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
