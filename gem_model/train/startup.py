"""The start-up fits: what a run computes from its training window before the first step, in one place.

    dense statistics   every run: dense inputs standardised with the window's (mean, std)
    train.head_bias    base_rate: each head's bias at the logit of its window rate (fresh weights only)
    train.dense_prior  heads' bias and dense wide weights from an L2 logistic regression (fresh weights only)
    train.wide_prior   per-id wide offsets from an L2 logistic regression (fresh weights only)
    train.item_svd     item table from the window's PPMI-SVD; a warm start folds the new ids into the old basis
                       (skipped when resuming: the checkpoint holds it)

Every fit writes into the unwrapped model; a resumed run then loads its checkpoint over them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gem_model.data.batch import TASKS
from gem_model.data.normalization import base_rates, dense_stats
from gem_model.models.gem import GEM
from gem_model.train.item_svd import set_topic_stat_mean, start_item_table
from gem_model.train.streams import RunStreams
from gem_model.train.wide_prior import set_dense_prior, set_wide_prior


@torch.no_grad()
def set_head_bias(model: GEM, rates: dict[str, dict[str, float]]) -> None:
    """Each (surface, task) head's bias := logit of its rate (clamped away from 0 and 1)."""
    for s, per_task in rates.items():
        if s in model.head_b:
            for t, rate in per_task.items():
                p = min(max(rate, 1e-4), 1 - 1e-4)
                model.head_b[s][TASKS.index(t)] = math.log(p / (1 - p))


def apply_startup_fits(core: GEM, train: dict[str, Any], streams: RunStreams, *, warm: bool, resuming: bool,
                       sharded: bool, say: Callable[[str], None]) -> None:
    """Run the fits `train` (a resolved train config) switches on, in the order of the module doc.
    warm: the weights come from an older checkpoint; resuming: a checkpoint of this run will be loaded."""
    core.set_dense_stats(*dense_stats(streams.uri, streams.days, streams.data["surfaces"], streams.features,
                                      streams.storage_options, streams.train.own_surface))
    if train["head_bias"] == "base_rate" and not warm:  # -3 logits is 400 steps away from a 70% rating-click world
        set_head_bias(core, base_rates(streams.uri, streams.days, streams.data["surfaces"], streams.storage_options))
    if (dp := train["dense_prior"]) and not warm:
        rows = set_dense_prior(core, streams.window(), list(dp["features"]), float(dp["l2"]),
                               pool_l2=dp.get("pool_l2"))
        say(f"dense prior on {list(dp['features'])}: labelled click rows {rows}")
    if (wp := train["wide_prior"]) and not warm:
        if sharded:
            raise ValueError("train.wide_prior needs replicated embedding tables")
        seen = set_wide_prior(core, streams.window(), list(wp["features"]), float(wp["l2"]), passes=int(wp["passes"]))
        say(f"wide prior (l2 {wp['l2']}, {int(wp['passes'])} pass(es)): ids with labels {seen}")
    if (svd := train["item_svd"]) and not resuming:
        if sharded:
            raise ValueError("train.item_svd needs replicated embedding tables")
        info = start_item_table(core, streams.window(), int(svd["dim"]), int(svd["max_rows"]), warm=warm)
        say(f"item table from PPMI-SVD: {info}")
        if core.cfg.topic_log_share and core.cfg.n_topic_stats:
            say(f"topic statistics' mean (a candidate without a topic vector reads it) over "
                f"{set_topic_stat_mean(core, streams.window())} rows: {core.topic_stat_mean.tolist()}")
