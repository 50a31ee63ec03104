"""Shapes and gradients of every block; jagged == padded; empty histories; presets."""

from __future__ import annotations

import pytest
import torch

from gem_model.models import GEM, GEMConfig
from gem_model.models.layers import (
    FMB,
    LCB,
    PMA,
    CrossArch,
    GatedCompression,
    PersonalisedFFN,
    SequenceMHA,
    TimeGapEncoding,
    WukongLayer,
    segment_ids,
)
from gem_model.models.target_attention import N_STATS, DINTargetAttention
from gem_model.train.config import load_preset
from tests.model.helpers import make_batch, tiny_model_config

torch.manual_seed(0)


def _grads_ok(module: torch.nn.Module, out: torch.Tensor) -> None:
    out.float().pow(2).mean().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None, f"{name} has no gradient"
        assert torch.isfinite(p.grad).all(), name


def test_fmb_lcb_wukong_shapes_and_grads():
    x = torch.randn(5, 6, 8, requires_grad=True)
    fmb = FMB(6, 8, k=3, n_out=4, hidden=16)
    assert fmb(x).shape == (5, 4, 8)
    _grads_ok(fmb, fmb(x))
    lcb = LCB(6, 2)
    assert lcb(x).shape == (5, 2, 8)
    layer = WukongLayer(6, 8, k=3, hidden=16)
    y = layer(x)
    assert y.shape == (5, 6, 8)
    _grads_ok(layer, y)
    shrink = WukongLayer(6, 8, k=3, hidden=16, n_out=4)
    assert shrink(x).shape == (5, 4, 8)
    _grads_ok(shrink, shrink(x))


def test_fmb_computes_xt_y_first():
    """FMB(X) depends on X only through X (X^T Y): equal to the n x n route."""
    fmb = FMB(5, 4, k=3, n_out=2, hidden=8)
    x = torch.randn(2, 5, 4)
    z_ref = torch.matmul(torch.matmul(x, x.transpose(1, 2)), fmb.Y)
    ref = fmb.mlp(fmb.ln(z_ref.flatten(1))).view(2, 2, 4)
    torch.testing.assert_close(fmb(x), ref, rtol=1e-4, atol=1e-5)


def _jagged(lengths: list[int], d: int):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    total = int(offsets[-1])
    return torch.randn(total, d, requires_grad=True), offsets, segment_ids(offsets, total)


def test_sequence_blocks_shapes_and_grads():
    d = 16
    values, offsets, seg = _jagged([3, 1, 5, 2], d)
    cond = torch.randn(4, 2 * d)
    pma = PMA(d, n_seeds=2, n_heads=1, cond_dim=2 * d)
    assert pma(values, seg, cond).shape == (4, 2, d)
    _grads_ok(pma, pma(values, seg, cond))
    pffn = PersonalisedFFN(d, 2 * d, mult=2)
    assert pffn(values, cond, seg).shape == values.shape
    mha = SequenceMHA(d, 1)
    out = mha.forward_jagged(values, offsets)
    assert out.shape == values.shape
    _grads_ok(mha, out)
    gc = GatedCompression(5, 2, d)
    x = torch.randn(4, 5, d)
    assert gc(x).shape == (4, 2, d)
    cross = CrossArch(5, d, n_sum=2, n_cls=1, n_pma=2, n_recent=3, n_heads=1)
    x_sum, s_sum = cross(x, values, offsets, seg, torch.tensor([2, 0, 4, 1]))
    assert x_sum.shape == (4, 2, d) and s_sum.shape == (4, 1 + 2 + 3, d)
    te = TimeGapEncoding(8, d)
    assert te(torch.tensor([0.0, 1.0, 1e9])).shape == (3, d)
    ta = DINTargetAttention(d, max_len=16)
    tok, summed, stats = ta(torch.randn(4, d), values.detach(), values, seg)
    assert tok.shape == summed.shape == (4, d) and stats.shape == (4, N_STATS - 1)  # no ids: no exact-match count


def test_target_attention_finds_the_candidate():
    d = 16
    torch.manual_seed(0)
    items = torch.randn(6, d)
    offsets = torch.tensor([0, 3, 6, 6])
    seg = segment_ids(offsets, 6)
    cand = torch.stack([items[1], -items[4], torch.randn(d)])
    with torch.no_grad():
        _, _, stats = DINTargetAttention(d, max_len=8)(cand, items, items, seg)
    raw_mean = stats[:, 4]  # the raw candidate . item affinity over the history
    assert raw_mean[0] > 0 > raw_mean[1]  # an exact match in row 0, an opposite one in row 1
    assert stats[2].abs().sum() == 0 and torch.isfinite(stats).all()  # empty history: no match, no NaN


def test_model_forward_backward_and_summary():
    cfg = tiny_model_config()
    model = GEM(cfg)
    batch = make_batch(cfg, [3, 0, 7, 16, 1])
    logits = model(batch)
    assert logits.shape == (5, 2)
    h = model.summary_embedding(batch)
    assert h.shape == (5, cfg.summary_dim)
    loss, parts = model.loss(logits, batch)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    assert set(parts) == {"click", "conversion"}


def test_shared_head_learns_from_every_surface_and_starts_each_own_head_at_it():
    cfg = tiny_model_config(shared_head=True)
    model = GEM(cfg)
    assert all(w.abs().sum().item() == 0 for w in model.head_w.values())  # each surface starts at the shared head
    batch = make_batch(cfg, [3, 2, 4, 1])
    feed = cfg.surfaces.index("feed")
    batch.surface_idx[:] = feed
    h = model.summary_embedding(batch)
    with torch.no_grad():
        model.head_w["feed"].normal_()
    inp = model.embed(batch)
    logits = model.head_logits(h, batch.surface_idx, inp.wide, batch.sparse, inp.cross)
    shared = model.head_w_shared.detach().clone()
    with torch.no_grad():
        model.head_w_shared.zero_()
    without = model.head_logits(h, batch.surface_idx, inp.wide, batch.sparse, inp.cross)
    # the deep logit is the surface's own head plus the shared one
    torch.testing.assert_close(logits - without, (h @ shared.T).detach())
    model = GEM(cfg)
    model.loss(model(batch), batch)[0].backward()  # rows of one surface
    assert model.head_w_shared.grad is not None and model.head_w_shared.grad.abs().sum() > 0
    others = [s for s in cfg.surfaces if s != "feed"]
    assert all(model.head_w[s].grad is None or float(model.head_w[s].grad.abs().sum()) == 0 for s in others)
    assert "head_w_shared" not in dict(GEM(tiny_model_config()).named_parameters())  # off by default


def test_conversion_loss_is_masked():
    cfg = tiny_model_config()
    model = GEM(cfg)
    batch = make_batch(cfg, [2, 3, 4])
    batch.label_mask[:, 1] = False
    logits = model(batch)
    _, parts = model.loss(logits, batch)
    assert float(parts["conversion"]) == 0.0
    # a surface without the conversion task never trains that head, whatever the mask says
    reels = cfg.surfaces.index("reels")
    batch = make_batch(cfg, [2, 3, 4])
    batch.surface_idx[:] = reels
    _, parts = model.loss(model(batch), batch)
    assert float(parts["conversion"]) == 0.0


@pytest.mark.parametrize("lengths", [[3, 0, 7, 16, 1], [0, 0, 0], [5]])
def test_jagged_equals_padded(lengths):
    """The jagged model and the padded-sequence variant with the same weights agree,
    including rows (or whole batches) with empty histories."""
    cfg = tiny_model_config(n_blocks=2)
    jagged = GEM(cfg).eval()
    padded = GEM(GEMConfig.from_dict({**cfg.to_dict(), "attention": "padded"})).eval()
    padded.load_state_dict(jagged.state_dict())
    batch = make_batch(cfg, lengths, seed=1)
    with torch.no_grad():
        a, b = jagged(batch), padded(batch)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_jagged_attention_equals_padded_sdpa_layer():
    mha = SequenceMHA(32, 2)
    values, offsets, _ = _jagged([4, 0, 9, 1], 32)
    out = mha.forward_jagged(values, offsets)
    import kernels

    p = kernels.jagged_to_padded(values, offsets, 9)
    mask = torch.arange(9)[None] < (offsets[1:] - offsets[:-1])[:, None]
    ref = kernels.padded_to_jagged(mha.forward_padded(p, mask), offsets)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_config_roundtrip_is_plain_data():
    cfg = tiny_model_config()
    d = cfg.to_dict()
    assert GEMConfig.from_dict(d) == cfg
    import json

    json.dumps(d)  # plain data only
    with pytest.raises(ValueError, match=r"unknown GEMConfig fields \['bogus'\]"):
        GEMConfig.from_dict({**d, "bogus": 1})
    with pytest.raises(ValueError, match=r"d_model/n_heads = 24/1 must be one of"):
        GEMConfig.from_dict({**d, "d_model": 24, "n_heads": 1})


@pytest.mark.parametrize("preset", ["tiny", "small", "base", "large"])
def test_presets_build_on_meta(preset):
    cfg = GEMConfig.from_specs(load_preset(preset)["model"])
    with torch.device("meta"):
        model = GEM(cfg)
    counts = model.param_counts()
    assert counts["total"] > 0
    if preset == "large":
        assert counts["total"] >= 1e8, counts
    train = load_preset(preset)["train"]
    for key in ("batch_size", "lr", "epochs", "warmup_steps", "checkpoint_every", "eval_batch_size"):
        assert key in train


def test_exact_match_statistic_counts_the_candidate_in_the_history():
    """The last match statistic is log1p(#history entries equal to the candidate's id), per row."""
    d = 8
    torch.manual_seed(0)
    offsets = torch.tensor([0, 3, 3, 5])  # row 1 has an empty history
    seg = segment_ids(offsets, 5)
    cand_ids = torch.tensor([7, 7, 9])
    hist_ids = torch.tensor([7, 2, 7, 9, 3])
    ta = DINTargetAttention(d, max_len=16)
    same = hist_ids == cand_ids[seg]
    _, _, stats = ta(torch.randn(3, d), torch.randn(5, d), torch.randn(5, d), seg, same=same)
    assert torch.allclose(stats[:, -1], torch.log1p(torch.tensor([2.0, 0.0, 1.0])))
    assert stats.shape == (3, N_STATS)


def test_wide_cross_reads_history_item_candidate_pairs():
    """The wide cross path (wide_cross_rows > 0) is 0 for an empty history and depends on the
    candidate through the (history item, candidate) pairs, row by row."""
    from gem_model.models.gem import CROSS, GEM
    from gem_model.models.synthetic_batches import config_from_assets, synthetic_batch

    cfg = config_from_assets("tiny", {"wide_cross_rows": 1 << 12})
    model = GEM(cfg)
    torch.nn.init.normal_(model.wide_tables[CROSS].weight)
    b = synthetic_batch(cfg, 32, torch.Generator().manual_seed(0))
    cross = model.embed(b).cross
    lengths = b.offsets[1:] - b.offsets[:-1]
    assert cross.shape == (32, 2) and torch.all(cross[lengths == 0] == 0) and torch.all(cross[lengths > 0] != 0)
    j, _ = cfg.target_pairs[0]
    r = int(torch.nonzero(lengths > 0)[0])
    b.sparse[r, j] = (b.sparse[r, j] % (cfg.tables[cfg.sparse_features[j][1]] - 2)) + 1  # another candidate
    moved = model.embed(b).cross
    others = torch.arange(32) != r
    assert not torch.allclose(moved[r], cross[r]) and torch.equal(moved[others], cross[others])
    assert GEM(config_from_assets("tiny")).embed(b).cross is None  # off unless asked for


def test_checkpoints_from_before_the_exact_match_statistic_still_load():
    from gem_model.models.config import GEMConfig
    from gem_model.models.gem import GEM
    from gem_model.models.synthetic_batches import config_from_assets

    old = config_from_assets("tiny", {"exact_match": False})
    state = GEM(old).state_dict()
    saved = {k: v for k, v in old.to_dict().items() if k != "exact_match"}  # what an old checkpoint carries
    GEM(GEMConfig.from_dict(saved)).load_state_dict(state)  # strict: every shape matches
    assert GEM(config_from_assets("tiny")).dense[0].in_features == GEM(old).dense[0].in_features + 1


def test_checkpoints_that_carry_removed_options_load_only_when_the_option_was_off():
    from gem_model.models.config import GEMConfig
    from gem_model.models.synthetic_batches import config_from_assets

    cfg = config_from_assets("tiny")
    saved = {**cfg.to_dict(), "cooc_weight": 0.0, "cooc_pairs": 2048, "topic_log_share": False, "click_action_row": 3}
    assert GEMConfig.from_dict(saved) == cfg
    with pytest.raises(ValueError, match="exposure_weight=0.5"):
        GEMConfig.from_dict({**cfg.to_dict(), "exposure_weight": 0.5})
