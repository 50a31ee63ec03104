"""The item table started from PPMI-SVD of the training window (train.item_svd): it must put an ad
next to the items of the histories it is shown with, from impressions alone (no click needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gem_model.models.gem import build_model
from gem_model.models.synthetic_batches import config_from_assets, synthetic_batch
from gem_model.train.item_svd import MAX_ROWS, Bags, Cooc, bag_counts, ppmi, set_item_svd, set_topic_stat_mean

N_TOPICS, PER_TOPIC = 4, 12
FIRST_AD = 1 + N_TOPICS * PER_TOPIC


def _exposure_batch(cfg, g: torch.Generator, rows: int = 64, length: int = 12, targeted: float = 0.7):
    """Every history draws its items from one topic; the row's ad is that topic's ad (id FIRST_AD + topic)
    with probability `targeted`, else a random ad. Labels are all 0: only impressions."""
    b = synthetic_batch(cfg, rows, g, min_len=length, max_len=length)
    j, col = cfg.target_pairs[0]
    topic = torch.randint(0, N_TOPICS, (rows,), generator=g)
    b.history[col] = 1 + topic.repeat_interleave(length) * PER_TOPIC + torch.randint(0, PER_TOPIC, (rows * length,), generator=g)
    random_ad = torch.randint(0, N_TOPICS, (rows,), generator=g)
    b.sparse[:, j] = FIRST_AD + torch.where(torch.rand(rows, generator=g) < targeted, topic, random_ad)
    b.labels.zero_()
    return b


def _ad_topic_cosines(model, cfg) -> torch.Tensor:
    """[ad topic, item topic] cosine of each ad to the mean direction of each topic's items."""
    j, _ = cfg.target_pairs[0]
    e = torch.nn.functional.normalize(model.tables[cfg.sparse_features[j][1]].weight.detach(), dim=-1)
    items = torch.nn.functional.normalize(e[1:FIRST_AD].reshape(N_TOPICS, PER_TOPIC, -1).mean(1), dim=-1)
    return e[FIRST_AD:FIRST_AD + N_TOPICS] @ items.T


def _own_minus_other(cos: torch.Tensor) -> torch.Tensor:
    own = cos.diagonal()
    return own - (cos.sum(1) - own) / (N_TOPICS - 1)


def test_ppmi_is_zero_for_independent_counts_and_positive_for_attraction():
    independent = torch.outer(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.allclose(ppmi(independent), torch.zeros(3, 3), atol=1e-6)
    block = torch.tensor([[0.0, 9.0, 1.0, 0.0], [9.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 9.0], [0.0, 1.0, 9.0, 0.0]])
    p = ppmi(block)
    assert p[0, 1] > 0.5 and p[2, 3] > 0.5 and p[0, 2] == 0.0 and p[0, 3] == 0.0  # never-met pairs stay 0


def test_item_svd_puts_each_ad_with_the_items_of_the_histories_it_is_shown_with():
    torch.manual_seed(0)
    cfg = config_from_assets("tiny")
    model = build_model(cfg)
    j, _ = cfg.target_pairs[0]
    name = f"tables.{cfg.sparse_features[j][1]}.weight"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    assert _own_minus_other(_ad_topic_cosines(model, cfg)).abs().max() < 0.5  # a random start knows no topics
    info = set_item_svd(model, [_exposure_batch(cfg, g) for _ in range(8)], dim=8)
    assert info == {"rows": N_TOPICS * PER_TOPIC + N_TOPICS, "bags": 8 * 64}
    assert bool((_own_minus_other(_ad_topic_cosines(model, cfg)) > 0.5).all()), _ad_topic_cosines(model, cfg)
    after = model.state_dict()
    assert {k for k in after if not torch.equal(after[k], before[k])} == {name}  # the item table only
    w, w0 = after[name], before[name]
    written = torch.zeros(len(w), dtype=torch.bool)
    written[1:FIRST_AD + N_TOPICS] = True
    assert torch.equal(w[~written], w0[~written])  # rows never seen keep their random start
    assert torch.allclose(w[written].norm(dim=1), w0.norm(dim=1).mean().expand(int(written.sum())), rtol=1e-4)
    assert not w[written][:, 8:].any()  # directions live in the first `dim` coordinates


def test_item_svd_rejects_a_dim_wider_than_the_table():
    cfg = config_from_assets("tiny")
    with pytest.raises(ValueError, match="item_svd.dim"):
        set_item_svd(build_model(cfg), [], dim=cfg.d_model + 1)


def test_train_starts_the_item_table_from_the_svd(lake, tmp_path):  # noqa: F811
    """train.item_svd runs inside train on the lake's window: the item table's seen rows start on
    the first `dim` coordinates (one step later they have barely left them), unlike the same run without it."""
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train
    from tests.model.conftest import tiny_config

    def items(out, **over):
        train(tiny_config(tmp_path / out, max_steps=1, eval_every=0, **over))
        model, _ = load_model(tmp_path / out / "model.pt")
        j, _ = model.cfg.target_pairs[0]
        return model.tables[model.cfg.sparse_features[j][1]].weight.detach()

    plain, svd = items("plain"), items("svd", item_svd={"dim": 4})
    moved = (svd != plain).any(1)
    assert int(moved.sum()) > 10
    tail = svd[moved][:, 4:].norm(dim=1) / svd[moved].norm(dim=1)
    head = plain[moved][:, 4:].norm(dim=1) / plain[moved].norm(dim=1)
    assert float(tail.mean()) < 0.5 * float(head.mean()), (float(tail.mean()), float(head.mean()))


def test_topic_statistics_read_the_frozen_svd_vectors():
    """model.topic_dim: item_svd writes the same directions into the `item_topic` buffer; the two topic
    statistics are the mean and max cosine of the candidate's vector with the history's, and training
    steps leave the buffer as written."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(config_from_assets("tiny"), topic_dim=8)
    model = build_model(cfg)
    assert "item_topic" in model.state_dict() and "item_topic" not in dict(model.named_parameters())
    g = torch.Generator().manual_seed(8)
    set_item_svd(model, [_exposure_batch(cfg, g) for _ in range(8)], dim=8)
    topic = model.item_topic.clone()
    assert topic[1:FIRST_AD + N_TOPICS].norm(dim=1).min() > 0.99 and not topic[FIRST_AD + N_TOPICS:].any()

    b = _exposure_batch(cfg, g, rows=16)
    j, col = cfg.target_pairs[0]
    seg = torch.repeat_interleave(torch.arange(16), b.offsets[1:] - b.offsets[:-1])
    stats = model.topic_stats(b, seg, 16)
    t = torch.nn.functional.normalize(topic, dim=-1)
    cos = (t[b.sparse[seg, j]] * t[b.history[col]]).sum(-1)
    for r in range(16):
        mine = cos[seg == r]
        assert torch.allclose(stats[r], torch.stack([mine.mean(), mine.max()]), atol=1e-5)
    # an ad shown with its own topic's history matches it better than an ad of another topic
    own = b.sparse[:, j] - FIRST_AD == (b.history[col][b.offsets[:-1]] - 1) // PER_TOPIC
    assert own.any() and (~own).any()
    assert float(stats[own, 0].min()) > float(stats[~own, 0].max())

    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    loss, _ = model.loss(model(b), b)
    loss.backward()
    opt.step()
    assert torch.equal(model.item_topic, topic)

    # model.topic_log_share: a third statistic, the log of the history's smoothed same-topic share, which
    # moves most between zero, one and two items of the topic, where the mean barely does
    logged = build_model(dataclasses.replace(cfg, topic_log_share=True))
    logged.item_topic.copy_(topic)
    three = logged.topic_stats(b, seg, 16)
    assert three.shape == (16, 3) and torch.allclose(three[:, :2], stats, atol=1e-6)
    for r in range(16):
        mine = cos[seg == r]
        assert torch.allclose(three[r, 2], torch.log((mine.clamp_min(0).sum() + 0.5) / (len(mine) + 1)), atol=1e-5)
    assert float(three[own, 2].min()) > float(three[~own, 2].max())
    empty = torch.tensor([], dtype=torch.long)
    assert torch.allclose(logged.topic_stats(dataclasses.replace(b, history={**b.history, col: empty}),
                                             empty, 16)[:, 2], torch.full((16,), float(np.log(0.5))))
    # a candidate without a topic vector (an ad born after the window, not folded in) reads the window's mean of
    # each statistic, which set_topic_stat_mean measures, not the log share of no match at all
    assert set_topic_stat_mean(logged, [b]) == 16
    assert torch.allclose(logged.topic_stat_mean, three.mean(0), atol=1e-5)
    unplaced = b.sparse.clone()
    unplaced[:3, j] = FIRST_AD + N_TOPICS + 1  # a row of the table no fit wrote
    got = logged.topic_stats(dataclasses.replace(b, sparse=unplaced), seg, 16)
    assert torch.allclose(got[:3], logged.topic_stat_mean.expand(3, 3)) and torch.allclose(got[3:], three[3:])
    # without topic vectors the option is inert: no statistic, and the wide path's last input keeps its start
    plain = build_model(dataclasses.replace(cfg, topic_dim=0, topic_log_share=True))
    assert plain.cfg.n_topic_stats == 0 and "topic_stat_mean" not in plain.state_dict()
    assert torch.equal(plain.wide[cfg.surfaces[0]], build_model(dataclasses.replace(cfg, topic_dim=0)).wide[cfg.surfaces[0]])


def test_item_svd_dim_must_match_the_topic_buffer():
    cfg = dataclasses.replace(config_from_assets("tiny"), topic_dim=8)
    model = build_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="must equal model.topic_dim"):
        set_item_svd(model, [_exposure_batch(cfg, torch.Generator().manual_seed(9))], dim=4)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing half-written


def test_item_svd_fits_only_the_rows_met_most_when_capped():
    """max_rows bounds the dense count matrix: the rows met in the most bags are fitted, the rest keep
    their random start."""
    torch.manual_seed(0)
    cfg = config_from_assets("tiny")
    model = build_model(cfg)
    j, col = cfg.target_pairs[0]
    table = model.tables[cfg.sparse_features[j][1]]
    before = table.weight.detach().clone()
    g = torch.Generator().manual_seed(10)
    batches = [_exposure_batch(cfg, g) for _ in range(4)]
    hot = FIRST_AD - 1  # the last item of the last topic: in every history, so met in every bag
    for b in batches:
        b.history[col][b.offsets[:-1]] = hot
    counts = torch.bincount(torch.cat([torch.cat([b.history[col], b.sparse[:, j]]) for b in batches]))
    counts[0] = 0
    cut = float(torch.topk(counts, 20).values[-1])  # rows met as often as the 20th may tie with it
    info = set_item_svd(model, batches, dim=8, max_rows=20)
    changed = set((table.weight.detach() != before).any(1).nonzero().flatten().tolist())
    assert info["rows"] == 20 and len(changed) == 20 and hot in changed
    assert set((counts > cut).nonzero().flatten().tolist()) <= changed <= set((counts >= cut).nonzero().flatten().tolist())


def test_counts_of_parts_summed_are_the_counts_of_their_bags_pooled():
    """Cooc: a fold over several days sums each day's counts instead of counting all their bags again
    (a day served in slices); pooled or summed, the fit reads the same rows and counts, capped or not."""
    cfg = config_from_assets("tiny")
    model = build_model(cfg)
    g = torch.Generator().manual_seed(3)
    parts = [Bags.read(model, [_exposure_batch(cfg, g, rows=rows)]) for rows in (64, 5, 40)]
    parts[1] = Bags(parts[1].rows, torch.where(parts[1].items % 3 == 0, 0, parts[1].items), parts[1].n)  # null ids
    pooled = Bags.cat(parts)
    for cap in (MAX_ROWS, 20):
        seen, counts = bag_counts(pooled.rows.long(), pooled.items.long(), pooled.n, cap)
        summed = Cooc.sum(Cooc.of(p) for p in parts)
        got_seen, got_counts = summed.capped(cap)
        assert torch.equal(got_seen, seen) and torch.equal(got_counts, counts) and summed.n == pooled.n
        assert (cap < len(summed.seen)) == (cap == 20)  # the cap binds in the second case only
    assert 0 not in summed.seen.tolist() and int(summed.counts.diagonal().abs().sum()) == 0
    # a part met on more rows than the cap keeps its most met ones, as bag_counts would of it alone
    alone = Cooc.of(parts[0], max_rows=10)
    assert torch.equal(alone.seen, bag_counts(parts[0].rows.long(), parts[0].items.long(), parts[0].n, 10)[0])
    assert Cooc.sum([]).n == 0 and len(Cooc.of(Bags.empty()).seen) == 0
