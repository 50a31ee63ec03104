"""The history co-occurrence loss (GEMConfig.cooc_weight): item embeddings learn the topics that
users' histories share, from the histories alone, and pairs that cross two histories teach nothing."""

from __future__ import annotations

import dataclasses

import torch

from gem_model.models.gem import build_model
from gem_model.models.synthetic_batches import config_from_assets, synthetic_batch

N_TOPICS, PER_TOPIC = 4, 12


def _config(**kw):
    return dataclasses.replace(config_from_assets("tiny"), cooc_weight=1.0, cooc_pairs=512, **kw)


def _topic_batch(cfg, g: torch.Generator, rows: int = 64, length: int = 16):
    """Every history draws its items from one topic: items 1 + topic * PER_TOPIC + (0..PER_TOPIC-1)."""
    b = synthetic_batch(cfg, rows, g, min_len=length, max_len=length)
    _, col = cfg.target_pairs[0]
    topic = torch.randint(0, N_TOPICS, (rows,), generator=g).repeat_interleave(length)
    b.history[col] = 1 + topic * PER_TOPIC + torch.randint(0, PER_TOPIC, (rows * length,), generator=g)
    return b


def _topic_cosines(model, cfg) -> tuple[float, float]:
    j, _ = cfg.target_pairs[0]
    e = torch.nn.functional.normalize(model.tables[cfg.sparse_features[j][1]].weight.detach()[1:1 + N_TOPICS * PER_TOPIC], dim=-1)
    cos = e @ e.T
    topic = torch.arange(N_TOPICS * PER_TOPIC) // PER_TOPIC
    same = (topic[:, None] == topic[None, :]) & ~torch.eye(len(topic), dtype=torch.bool)
    return float(cos[same].mean()), float(cos[topic[:, None] != topic[None, :]].mean())


def test_cooc_loss_clusters_items_by_the_topic_their_histories_share():
    torch.manual_seed(0)
    cfg = _config()
    model = build_model(cfg)
    g = torch.Generator().manual_seed(1)
    before = _topic_cosines(model, cfg)
    opt = torch.optim.Adam(model.tables.parameters(), lr=0.03)
    for _ in range(60):
        loss = model.cooc_loss(_topic_batch(cfg, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    same, other = _topic_cosines(model, cfg)
    assert abs(before[0] - before[1]) < 0.1  # a random init knows no topics
    assert same - other > 0.5, (same, other)


def test_pairs_across_histories_or_null_ids_weigh_nothing():
    cfg = _config()
    model = build_model(cfg)
    g = torch.Generator().manual_seed(2)
    one = synthetic_batch(cfg, 32, g, min_len=1, max_len=1)  # every pair (k, k+1) spans two histories
    loss = model.cooc_loss(one)
    assert float(loss) == 0.0
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    _, col = cfg.target_pairs[0]
    nulls = synthetic_batch(cfg, 32, g, min_len=8, max_len=8)
    nulls.history[col] = torch.zeros_like(nulls.history[col])
    assert float(model.cooc_loss(nulls)) == 0.0
    assert float(model.cooc_loss(synthetic_batch(cfg, 32, g, min_len=8, max_len=8))) > 0.0


def test_cooc_weight_needs_a_history_item_column():
    cfg = config_from_assets("tiny")
    try:
        dataclasses.replace(cfg, cooc_weight=1.0, target_attention=False)
    except ValueError as e:
        assert "cooc_weight needs a history item column" in str(e)
    else:
        raise AssertionError("cooc_weight without an item history was accepted")


def test_cooc_clicks_pull_a_clicked_ad_toward_its_history_topic():
    """cooc_clicks: ads (ids above the topic items) clicked by users whose histories hold one topic end
    closer to that topic's items than to the others'."""
    torch.manual_seed(0)
    cfg = _config(cooc_clicks=True)
    model = build_model(cfg)
    j, col = cfg.target_pairs[0]
    first_ad = 1 + N_TOPICS * PER_TOPIC
    g = torch.Generator().manual_seed(3)
    opt = torch.optim.Adam(model.tables.parameters(), lr=0.03)
    for _ in range(60):
        b = _topic_batch(cfg, g)
        topic = (b.history[col][b.offsets[:-1]] - 1) // PER_TOPIC  # every history holds one topic
        b.sparse[:, j] = first_ad + topic  # ad t is the ad of topic t
        b.labels[:, 0] = (torch.rand(len(b), generator=g) < 0.5).float()
        loss = model.cooc_loss(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    e = torch.nn.functional.normalize(model.tables[cfg.sparse_features[j][1]].weight.detach(), dim=-1)
    items = e[1:first_ad].reshape(N_TOPICS, PER_TOPIC, -1).mean(1)
    cos = e[first_ad:first_ad + N_TOPICS] @ torch.nn.functional.normalize(items, dim=-1).T  # [ad topic, item topic]
    own = cos.diagonal()
    other = (cos.sum(1) - own) / (N_TOPICS - 1)
    assert bool((own - other > 0.3).all()), cos


def test_pretraining_fits_the_item_table_alone():
    from gem_model.train.cooc_pretrain import pretrain_item_embeddings

    torch.manual_seed(0)
    cfg = dataclasses.replace(config_from_assets("tiny"), cooc_pairs=512)  # cooc_weight 0: pretraining only
    model = build_model(cfg)
    j, _ = cfg.target_pairs[0]
    item_table = cfg.sparse_features[j][1]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    info = pretrain_item_embeddings(model, [_topic_batch(cfg, g) for _ in range(12)], repeats=5, lr=0.03)
    assert info["steps"] == 60 and info["loss_last"] < info["loss_first"]
    same, other = _topic_cosines(model, cfg)
    assert same - other > 0.5, (same, other)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved == {f"tables.{item_table}.weight"}


def test_train_runs_the_pretraining_before_its_first_step(lake, tmp_path):  # noqa: F811
    """train.cooc_pretrain runs inside train, on the lake's training window: the item table ends
    elsewhere than in the same seeded run without it, which itself is reproducible."""
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train
    from tests.model.conftest import tiny_config

    def items(out, **over):
        train(tiny_config(tmp_path / out, max_steps=1, eval_every=0, **over))
        model, _ = load_model(tmp_path / out / "model.pt")
        j, _ = model.cfg.target_pairs[0]
        return model.tables[model.cfg.sparse_features[j][1]].weight

    plain = items("plain")
    pre = items("pre", cooc_pretrain={"repeats": 2, "lr": 0.05})
    assert not torch.equal(plain, pre)
    assert torch.equal(plain, items("plain_again"))  # the difference is the pretraining, not chance
