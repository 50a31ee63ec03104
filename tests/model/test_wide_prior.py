"""train.wide_prior: per-id wide offsets from counts before training (off by default)."""

from __future__ import annotations

import pytest
import torch

from gem_model.models import GEM
from gem_model.train.wide_prior import set_dense_prior, set_wide_prior
from tests.model.helpers import make_batch, tiny_model_config


def _toy(cfg):
    """Four labelled rows of one surface, heads at logit 0: users 7, 7, 7, 9 on items 3, 4, 4, 4."""
    names = [n for n, _ in cfg.sparse_features]
    ju, ji = names.index("user_id"), names.index("ad_id")
    batch = make_batch(cfg, [1, 1, 1, 1])
    batch.surface_idx = torch.zeros(4, dtype=torch.long)
    batch.sparse[:, ju] = torch.tensor([7, 7, 7, 9])
    batch.sparse[:, ji] = torch.tensor([3, 4, 4, 4])
    batch.labels = torch.tensor([[1.0, 0], [1, 0], [0, 0], [1, 0]])
    batch.label_mask = torch.tensor([[True, False]] * 4)  # clicks only: conversion offsets stay 0
    return batch, ju, ji


def test_one_pass_is_a_newton_step_per_feature_in_turn() -> None:
    torch.manual_seed(0)
    cfg = tiny_model_config()
    model = GEM(cfg)
    batch, ju, ji = _toy(cfg)
    model.head_b[cfg.surfaces[0]].data[:] = 0.0  # b = 0.5: curvature 0.25 per labelled row
    z0 = torch.zeros(4, dtype=torch.float64)
    seen = set_wide_prior(model, [batch], ["user_id", "ad_id"], l2=1.0)
    assert seen == {"user_id": 2, "ad_id": 2}
    user = model.wide_tables[cfg.sparse_features[ju][1]].weight.detach().double()
    item = model.wide_tables[cfg.sparse_features[ji][1]].weight.detach().double()
    y = batch.labels[:, 0].double()

    def step(z: torch.Tensor, rows: list[int]) -> float:
        p = torch.sigmoid(z[rows])
        return float((y[rows] - p).sum() / ((p * (1 - p)).sum() + 1.0))

    u7, u9 = step(z0, [0, 1, 2]), step(z0, [3])  # users 7 and 9: (0.5 + 0.5 - 0.5) / 1.75, 0.5 / 1.25
    assert (u7, u9) == (pytest.approx(0.5 / 1.75), pytest.approx(0.5 / 1.25))
    assert user[7, 0].item() == pytest.approx(u7) and user[9, 0].item() == pytest.approx(u9)
    z1 = z0 + torch.tensor([u7, u7, u7, u9], dtype=torch.float64)  # the items' step sees the users' offsets
    assert item[3, 0].item() == pytest.approx(step(z1, [0])) and item[4, 0].item() == pytest.approx(step(z1, [1, 2, 3]))
    assert user[8].abs().sum() == 0 and user[:, 1].abs().sum() == 0  # unseen ids and unlabelled tasks: 0
    with pytest.raises(ValueError, match="not sparse features"):
        set_wide_prior(model, [batch], ["nope"], l2=1.0)


def test_passes_converge_to_the_joint_l2_logistic_regression() -> None:
    """At the fit every offset's penalised gradient is 0: sum over its rows (y - p) = l2 * w,
    p = sigmoid(head bias + user offset + item offset)."""
    torch.manual_seed(0)
    cfg = tiny_model_config()
    names = [n for n, _ in cfg.sparse_features]
    ju, ji = names.index("user_id"), names.index("ad_id")
    batch = make_batch(cfg, [1] * 64)
    batch.surface_idx = torch.zeros(64, dtype=torch.long)
    batch.sparse[:, ju] = torch.randint(1, 9, (64,))
    batch.sparse[:, ji] = torch.randint(1, 7, (64,))
    batch.labels = torch.stack([(torch.rand(64) < 0.3 + 0.05 * batch.sparse[:, ju]).float(), torch.zeros(64)], 1)
    batch.label_mask = torch.tensor([[True, False]] * 64)

    def kkt(passes: int) -> float:
        model = GEM(cfg)
        model.head_b[cfg.surfaces[0]].data[:] = -0.4
        set_wide_prior(model, [batch], ["user_id", "ad_id"], l2=0.5, passes=passes)
        wu = model.wide_tables[cfg.sparse_features[ju][1]].weight.detach()[:, 0].double()
        wi = model.wide_tables[cfg.sparse_features[ji][1]].weight.detach()[:, 0].double()
        u, i, y = batch.sparse[:, ju], batch.sparse[:, ji], batch.labels[:, 0].double()
        r = y - torch.sigmoid(-0.4 + wu[u] + wi[i])
        gu = torch.zeros_like(wu).index_add_(0, u, r) - 0.5 * wu
        gi = torch.zeros_like(wi).index_add_(0, i, r) - 0.5 * wi
        return float(torch.cat([gu, gi]).abs().max())

    one, many = kkt(1), kkt(30)
    assert many < 1e-3 < one  # one sweep is not the fit; thirty are


def test_passes_must_be_positive() -> None:
    cfg = tiny_model_config()
    batch, _, _ = _toy(cfg)
    with pytest.raises(ValueError, match="passes"):
        set_wide_prior(GEM(cfg), [batch], ["user_id"], l2=1.0, passes=0)


@pytest.mark.timeout(300)
def test_train_starts_from_the_prior_and_without_it_from_zero(lake, tmp_path) -> None:
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train
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
    # train passes `passes` through: with the items' offsets in the fit the users' move
    one = user_offsets("one", wide_prior={"features": ["user_id", "ad_id"], "l2": 1.0})
    five = user_offsets("five", wide_prior={"features": ["user_id", "ad_id"], "l2": 1.0, "passes": 5})
    assert not torch.allclose(one, five)


def _counter_world(cfg, n: int = 20000):
    """One surface, clicks ~ Bernoulli(sigmoid(-0.5 + 1.5 x)) with x the raw first dense feature
    (mean 2, std 3: the fit sees it standardised); user 7 on the even rows, 9 on the odd."""
    g = torch.Generator().manual_seed(0)
    batch = make_batch(cfg, [1] * n)
    batch.surface_idx = torch.zeros(n, dtype=torch.long)
    batch.dense = torch.randn(n, len(cfg.dense_features), generator=g)
    batch.dense[:, 0] = 2.0 + 3.0 * batch.dense[:, 0]
    batch.labels = torch.zeros(n, 2)
    batch.labels[:, 0] = (torch.rand(n, generator=g) < torch.sigmoid(-0.5 + 1.5 * (batch.dense[:, 0] - 2) / 3)).float()
    batch.label_mask = torch.tensor([[True, False]] * n)
    ju = [n for n, _ in cfg.sparse_features].index("user_id")
    batch.sparse[:, ju] = torch.tensor([7, 9] * (n // 2))
    return batch, ju


def test_dense_prior_is_the_logistic_regression_on_the_standardised_features() -> None:
    cfg = tiny_model_config()
    model = GEM(cfg)
    names, s0 = cfg.dense_features, cfg.surfaces[0]
    model.set_dense_stats(torch.tensor([2.0] + [0.0] * (len(names) - 1)), torch.tensor([3.0] + [1.0] * (len(names) - 1)))
    batch, _ = _counter_world(cfg)
    conv_bias = float(model.head_b[s0][1])
    rows = set_dense_prior(model, [batch], names[:2], l2=1.0)
    assert rows == {s0: 20000}
    assert float(model.wide[s0][0, 0]) == pytest.approx(1.5, abs=0.1)  # the true slope per std
    assert abs(float(model.wide[s0][0, 1])) < 0.05  # an unrelated feature: about 0
    assert float(model.head_b[s0][0]) == pytest.approx(-0.5, abs=0.06)
    assert not model.wide[s0][0, 2:].any()  # other dense features and the match statistics: 0
    assert float(model.head_b[s0][1]) == conv_bias and not model.wide[s0][1, :len(names)].any()  # no conversion labels
    assert all(not model.wide[s][0, :len(names)].any() for s in cfg.surfaces[1:])  # surfaces without rows
    with pytest.raises(ValueError, match="not dense features"):
        set_dense_prior(model, [batch], ["no_such_feature"])


def test_the_wide_prior_fits_what_the_dense_prior_leaves() -> None:
    cfg = tiny_model_config()
    names = cfg.dense_features
    batch, ju = _counter_world(cfg)  # both users' clicks follow the feature alone

    def user_offsets(dense_first: bool) -> torch.Tensor:
        model = GEM(cfg)
        model.set_dense_stats(torch.tensor([2.0] + [0.0] * (len(names) - 1)), torch.tensor([3.0] + [1.0] * (len(names) - 1)))
        model.head_b[cfg.surfaces[0]].data[:] = 0.0
        if dense_first:
            set_dense_prior(model, [batch], names[:1])
        set_wide_prior(model, [batch], ["user_id"], l2=1.0, passes=3)
        return model.wide_tables[cfg.sparse_features[ju][1]].weight[[7, 9], 0]

    alone, after = user_offsets(False), user_offsets(True)
    # from a bias of 0 the offsets are the users' own log-odds (a ~42% rate: about -0.3); after the
    # dense prior nothing is left for them to explain
    assert float(alone.abs().min()) > 0.2 and float(after.abs().max()) < 0.05


@pytest.mark.timeout(300)
def test_train_starts_from_the_dense_prior(lake, tmp_path) -> None:
    from gem_model.config import load_features
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train
    from tests.model.conftest import tiny_config

    first = load_features().dense[0].name

    def click_weights(out, **over):
        s = train(tiny_config(tmp_path / out, max_steps=1, eval_every=0, lr=1e-9, **over))
        model, _ = load_model(s["checkpoint"])
        return torch.stack([model.wide[s][0, : len(model.cfg.dense_features)] for s in model.cfg.surfaces])

    plain = click_weights("plain")
    fitted = click_weights("fitted", dense_prior={"features": [first], "l2": 1.0})
    assert torch.allclose(plain, torch.zeros_like(plain), atol=1e-6)
    assert fitted[:, 0].abs().min() > 1e-3  # every surface's click head got a fitted weight
    assert torch.allclose(fitted[:, 1:], torch.zeros_like(fitted[:, 1:]), atol=1e-6)


def _slopes(cfg, batch, **kw) -> list[float]:
    model = GEM(cfg)
    model.set_dense_stats(torch.tensor([2.0] + [0.0] * (len(cfg.dense_features) - 1)),
                          torch.tensor([3.0] + [1.0] * (len(cfg.dense_features) - 1)))
    set_dense_prior(model, [batch], cfg.dense_features[:1], l2=1.0, **kw)
    return [float(model.wide[s][0, 0]) for s in cfg.surfaces[:2]]


def test_pooled_dense_prior_lends_a_small_surface_the_others_slope() -> None:
    """Surface 0: 20,000 rows of slope 1.5; surface 1: its last 60 rows, relabelled with slope -1.5 and
    another rate. Alone, surface 1's fit is its own noisy slope; pooled, it moves toward surface 0's."""
    cfg = tiny_model_config()
    batch, _ = _counter_world(cfg)
    g = torch.Generator().manual_seed(1)
    small = torch.arange(len(batch.labels) - 60, len(batch.labels))
    batch.surface_idx[small] = 1
    x = (batch.dense[small, 0] - 2) / 3
    batch.labels[small, 0] = (torch.rand(60, generator=g) < torch.sigmoid(1.0 - 1.5 * x)).float()
    alone = _slopes(cfg, batch)
    assert alone[1] < -0.3 and alone[0] == pytest.approx(1.5, abs=0.1)
    # one surface's rows alone give the same fit as before pooling existed
    only_small = make_batch(cfg, [1] * 60)
    for f in ("surface_idx", "dense", "labels", "label_mask"):
        setattr(only_small, f, getattr(batch, f)[small])
    assert _slopes(cfg, only_small)[1] == pytest.approx(alone[1], abs=1e-9)
    assert _slopes(cfg, only_small, pool_l2=10.0)[1] == pytest.approx(alone[1], abs=1e-9)  # nothing to pool with
    some, tied = _slopes(cfg, batch, pool_l2=10.0), _slopes(cfg, batch, pool_l2=1e7)
    assert alone[1] < some[1] < tied[1]  # the stronger the pooling, the closer to the shared slope
    assert tied[0] == pytest.approx(tied[1], abs=1e-3) and tied[0] == pytest.approx(1.5, abs=0.1)
    assert some[0] == pytest.approx(alone[0], abs=0.02)  # the big surface barely moves
    with pytest.raises(ValueError, match="pool_l2"):
        _slopes(cfg, batch, pool_l2=0.0)
