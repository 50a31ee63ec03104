"""history_click_share: the user's own labels in the history as wide inputs (off by default)."""

from __future__ import annotations

import math

import torch

from gem_model.models import GEM
from tests.model.helpers import make_batch, tiny_model_config


def test_click_share_counts_the_history_clicks_overall_and_on_the_candidate_surface() -> None:
    off = tiny_model_config()
    assert off.n_click_share == 0 and GEM(off).dense[0].in_features == GEM(off).wide[off.surfaces[0]].shape[1]
    cfg = tiny_model_config(history_click_share=True)
    assert cfg.click_action_row > 0 and cfg.n_click_share == 4
    model = GEM(cfg)
    assert model.wide[cfg.surfaces[0]].shape[1] == GEM(off).wide[off.surfaces[0]].shape[1] + 4
    batch = make_batch(cfg, [3, 0, 2])
    action, surf, j = cfg.click_share_columns
    click, other = cfg.click_action_row, cfg.click_action_row + 1
    batch.history[action] = torch.tensor([click, other, click, click, other])
    s = batch.sparse[:, j]
    batch.history[surf] = torch.stack([s[0], s[0], s[0] + 1, s[2] + 1, s[2]])
    seg = torch.tensor([0, 0, 0, 2, 2])
    got = model.click_share(batch, seg, 3)
    want = torch.tensor([
        [2 / 3, 1 / 2, math.log1p(3), math.log1p(2)],   # 2 clicks of 3; on its surface 1 of 2
        [0.0, 0.0, 0.0, 0.0],                           # empty history: zero counts
        [1 / 2, 0.0, math.log1p(2), math.log1p(1)],    # 1 of 2; its own surface: 0 of 1
    ])
    torch.testing.assert_close(got, want)
    logits = model(batch)
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
