"""train.wide_prior: per-id wide offsets from counts before training (off by default)."""

from __future__ import annotations

import math

import pytest
import torch

from gem_model.models import GEM
from gem_model.wide_prior import set_wide_prior
from tests.model.helpers import make_batch, tiny_model_config


def test_offsets_are_one_newton_step_of_the_l2_logistic_regression() -> None:
    torch.manual_seed(0)
    cfg = tiny_model_config()
    model = GEM(cfg)
    names = [n for n, _ in cfg.sparse_features]
    ju, ji = names.index("user_id"), names.index("ad_id")
    batch = make_batch(cfg, [1, 1, 1, 1])
    batch.surface_idx = torch.zeros(4, dtype=torch.long)
    surface = cfg.surfaces[0]
    model.head_b[surface].data[:] = 0.0  # b = 0.5 on both tasks: curvature 0.25 per labelled row
    batch.sparse[:, ju] = torch.tensor([7, 7, 7, 9])
    batch.sparse[:, ji] = torch.tensor([3, 4, 4, 4])
    batch.labels = torch.tensor([[1.0, 0], [1, 0], [0, 0], [1, 0]])
    batch.label_mask = torch.tensor([[True, False]] * 4)  # clicks only: conversion offsets stay 0
    seen = set_wide_prior(model, [batch], ["user_id", "ad_id"], l2=1.0)
    assert seen == {"user_id": 2, "ad_id": 2}
    user = model.wide_tables[cfg.sparse_features[ju][1]].weight
    item = model.wide_tables[cfg.sparse_features[ji][1]].weight
    # user 7: residuals 0.5 + 0.5 - 0.5 over 3 * 0.25 + 1; user 9: 0.5 / 1.25; unseen ids: 0
    assert user[7, 0].item() == pytest.approx(0.5 / 1.75)
    assert user[9, 0].item() == pytest.approx(0.5 / 1.25)
    assert item[4, 0].item() == pytest.approx(0.5 / 1.75) and item[3, 0].item() == pytest.approx(0.5 / 1.25)
    assert user[8].abs().sum() == 0 and user[:, 1].abs().sum() == 0
    # the offsets move the logits as they should: a user with more clicks starts higher
    with torch.no_grad():
        logits = model(batch)
    assert math.isfinite(float(logits.sum()))
    with pytest.raises(ValueError, match="not sparse features"):
        set_wide_prior(model, [batch], ["nope"], l2=1.0)


@pytest.mark.timeout(300)
def test_train_starts_from_the_prior_and_without_it_from_zero(lake, tmp_path) -> None:
    from gem_model.registry import load_model
    from gem_model.train import train
    from tests.model.conftest import tiny_config

    def user_offsets(out, **over):
        s = train(tiny_config(tmp_path / out, max_steps=1, eval_every=0, **over))
        model, _ = load_model(s["checkpoint"])
        j = [n for n, _ in model.cfg.sparse_features].index("user_id")
        return model.wide_tables[model.cfg.sparse_features[j][1]].weight[:, 0]

    plain = user_offsets("plain")
    prior = user_offsets("prior", wide_prior={"features": ["user_id"], "l2": 1.0})
    # one step of 128 rows touches at most 128 user rows; the prior sets every user of the window
    assert int((plain != 0).sum()) <= 128 < int((prior != 0).sum())
