"""Model inputs: closed vocabularies without collisions, heads keyed by surface name, fixed dense
normalisation, bootstrap intervals that know when two models differ."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from gem_model.config import SurfacesConfig, load_features, load_surfaces
from gem_model.data.loader import Encoder
from gem_model.data.vocab import hash_int64, lookup
from gem_model.eval.metrics import bootstrap_ne, paired_difference
from gem_model.models import GEM
from gem_model.store.schemas import ACTIONS, CREATIVE_FORMATS, DEVICES, OBJECTIVES
from tests.model.helpers import make_batch, tiny_model_config


def test_enums_surfaces_and_actions_never_collide():
    features, surfaces = load_features(), load_surfaces()
    enc = Encoder(features, surfaces)
    for name, values in (("objective", OBJECTIVES), ("creative_format", CREATIVE_FORMATS), ("device", DEVICES),
                         ("hist_action", ACTIONS), ("surface", tuple(surfaces.names))):
        rows = enc._ids(name, pa.array(list(values)), 8)
        assert sorted(rows.tolist()) == list(range(1, len(values) + 1)), name  # distinct rows, none is 0
    # null and unknown values share the reserved row 0
    assert enc._ids("device", pa.array([None, "fridge"], pa.string()), 8).tolist() == [0, 0]


def test_lookup_rows_do_not_move_when_the_vocabulary_grows():
    # value i of the vocabulary is row i + 1 (row 0: unknown), whatever comes after it
    assert lookup(pa.array(["b", "a"]), ["a", "b"]).tolist() == [2, 1]
    assert lookup(pa.array(["b", "a", "c"]), ["a", "b", "c"]).tolist() == [2, 1, 3]


def test_warm_start_with_one_more_surface_keeps_the_other_heads():
    base = load_surfaces()
    more = SurfacesConfig.model_validate({"surfaces": [
        *[s.model_dump() | {"traffic_share": s.traffic_share * 0.9} for s in base.surfaces],
        {"name": "stories", "domain": "social", "format": "parquet", "traffic_share": 0.1, "tasks": ["click"]},
    ]})
    from gem_model.models import GEMConfig
    from gem_model.train.config import load_preset

    old = GEM(GEMConfig.from_specs(load_preset("tiny")["model"], surfaces=base))
    new = GEM(GEMConfig.from_specs(load_preset("tiny")["model"], surfaces=more))
    state = old.state_dict()
    own = new.state_dict()
    new.load_state_dict({k: v for k, v in state.items() if k in own and own[k].shape == v.shape}, strict=False)
    for s in base.names:
        torch.testing.assert_close(new.head_w[s], old.head_w[s])
        torch.testing.assert_close(new.wide[s], old.wide[s])
    assert "stories" in new.head_w and "stories" not in old.head_w


def test_dense_normalisation_is_fixed_not_running():
    torch.manual_seed(0)
    model = GEM(tiny_model_config())
    n = len(model.cfg.dense_features)
    mean = [float(i + 1) for i in range(n)]
    model.set_dense_stats(mean, [2.0] * n)
    batch = make_batch(model.cfg, [3, 0, 5, 2])
    model.train()
    for _ in range(3):
        model(batch)  # training forwards do not move the statistics
    assert model.dense_mean.tolist() == mean
    assert "dense_mean" in model.state_dict() and "dense_std" in model.state_dict()
    inp = model.embed(batch)
    torch.testing.assert_close(inp.wide[:, :n], (batch.dense - model.dense_mean) / model.dense_std)


def test_paired_bootstrap_separates_a_better_model_and_not_a_copy():
    rng = np.random.default_rng(0)
    p_true = rng.uniform(0.01, 0.2, 20000)
    y = (rng.random(20000) < p_true).astype(float)
    base = np.full_like(p_true, y.mean())
    boot = bootstrap_ne(y, {"good": p_true, "base": base, "same": p_true.copy()}, n_boot=200)
    assert paired_difference(boot["good"], boot["base"], 0.0)["verdict"] == "a better"
    assert paired_difference(boot["good"], boot["same"], 0.0)["verdict"] == "no difference shown"


@pytest.mark.parametrize("name", ["user_id", "ad_id"])
def test_open_vocabularies_are_hashed(name):
    features = load_features()
    enc = Encoder(features, load_surfaces())
    assert name not in enc.vocab  # no closed vocabulary: an id never seen still gets a row
    buckets = int(next(f.buckets for f in features.sparse if f.name == name))
    rows = enc._ids(name, pa.array([1, 2, 2**40, None], pa.int64()), buckets)
    assert rows[:3].tolist() == hash_int64(np.array([1, 2, 2**40]), buckets).tolist()
    assert rows[3] == 0 and ((rows[:3] >= 1) & (rows[:3] < buckets)).all()  # 0 is null's row alone


def test_din_sum_pooling_keeps_the_strength_of_the_match():
    from gem_model.models.layers import segment_ids
    from gem_model.models.target_attention import DINTargetAttention

    torch.manual_seed(0)
    d = 16
    ta = DINTargetAttention(d, max_len=8).eval()
    cand = torch.randn(1, d)
    other = torch.randn(1, d)
    once = torch.cat([cand, other, other, other])  # the candidate once in a history of 4
    thrice = torch.cat([cand, cand, cand, other])  # ... and three times
    items = torch.cat([once, thrice])
    offsets = torch.tensor([0, 4, 8, 8])  # the third row has an empty history
    seg = segment_ids(offsets, 8)
    with torch.no_grad():
        normed, summed, stats = ta(cand.repeat(3, 1), items, items, seg)
    # the raw affinity statistic is the mean candidate . item dot product (x RAW_SCALE)
    from gem_model.models.target_attention import RAW_SCALE

    assert float(stats[0, 4]) == pytest.approx(float((once @ cand[0]).mean()) * RAW_SCALE, rel=1e-4)
    # unnormalised pooling differs between one and three matches; an empty history gives zeros
    assert not torch.allclose(summed[0], summed[1])
    assert float(stats[1, 4]) > float(stats[0, 4])
    assert stats[2].abs().sum() == 0 and summed[2].abs().sum() == 0
    assert torch.isfinite(normed).all()
