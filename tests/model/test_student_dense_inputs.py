"""The student's dense inputs: standardised per feature with its training rows' statistics (which a warm start
keeps), a wide path from them into the serving head, and checkpoints saved before either existed."""

from __future__ import annotations

import pytest
import torch

from gem_model.config import load_features
from gem_model.data.loader import date_range
from gem_model.distill import Student, student_config, train_student
from gem_model.distill.trainer import load_student, predict_student, save_student

from .distill_fixtures import world  # noqa: F401
from .test_distill_core import feed, preset  # noqa: F401

OLD_KEYS = ("dense_inputs", "wide")


def make(preset, **arch) -> Student:  # noqa: F811
    cfg = student_config({**preset["student"], **arch}, features=load_features(), teacher_d_model=32, surface="feed",
                         tasks=["click", "conversion"])
    return Student(cfg)


def test_standardized_inputs_use_the_training_rows_statistics_and_a_warm_start_keeps_them(feed, preset, world):  # noqa: F811
    train = feed.on_dates(date_range(*world.roles.student))
    val = feed.on_dates([world.roles.validation])
    cfg = {**preset["train"], "epochs": 1, "max_steps": 5}
    cold = make(preset, dense_inputs="standardized", wide=True)
    train_student(cold, train, val, "labels_only", cfg, seed=0)
    torch.testing.assert_close(cold.dense_mean, train.dense.float().mean(0))
    torch.testing.assert_close(cold.dense_std, train.dense.float().std(0).clamp_min(1e-3))

    warm = make(preset, dense_inputs="standardized", wide=True)
    warm.load_state_dict(cold.state_dict())
    train_student(warm, val, val, "labels_only", cfg, seed=1, keep_start=True)  # other rows, other statistics
    assert torch.equal(warm.dense_mean, cold.dense_mean) and torch.equal(warm.dense_std, cold.dense_std)
    assert not torch.allclose(val.dense.float().mean(0), cold.dense_mean)


def test_one_feature_moving_leaves_the_others_where_they_were_unlike_a_layer_norm(preset):  # noqa: F811
    """A LayerNorm normalises across a row's features: the hour of day (0-23) moving re-scales the counters
    beside it. Standardised per feature, the other inputs do not move."""
    m = len(load_features().dense)
    hour = [f.name for f in load_features().dense].index("hour_of_day")
    x = torch.randn(8, m)
    y = x.clone()
    y[:, hour] += 12.0
    others = [j for j in range(m) if j != hour]
    std = make(preset, dense_inputs="standardized", wide=False)
    with torch.no_grad():
        std.dense_std.fill_(2.0)
        std.dense_mean.fill_(0.5)
        torch.testing.assert_close(std.dense_features(y)[:, others], std.dense_features(x)[:, others])
        ln = make(preset, dense_inputs="layer_norm", wide=False)
        assert not torch.allclose(ln.dense_features(y)[:, others], ln.dense_features(x)[:, others])


def test_the_wide_path_adds_a_linear_term_of_the_standardised_features(feed, preset):  # noqa: F811
    part = feed.take(torch.arange(64))
    s = make(preset, dense_inputs="standardized", wide=True).eval()
    s.set_dense_stats(feed.dense)
    inputs = (part.dense, part.sparse, part.hist_ids)
    with torch.no_grad():
        base = s(*inputs)
        s.wide.weight.zero_()
        assert torch.equal(s(*inputs), base)  # it starts at 0: the head's logits alone
        s.wide.weight[0, 2] = 0.7
        got = s(*inputs) - base
    torch.testing.assert_close(got[:, 0], 0.7 * (part.dense[:, 2].float() - s.dense_mean[2]) / s.dense_std[2])
    torch.testing.assert_close(got[:, 1], torch.zeros(64))
    assert any(p is s.wide.weight for p in s.serving_head_parameters())


def test_a_student_saved_before_the_option_loads_with_its_layer_norm(preset, feed, tmp_path):  # noqa: F811
    old = make(preset, dense_inputs="layer_norm", wide=False)
    old.cfg = {k: v for k, v in old.cfg.items() if k not in OLD_KEYS}  # the config such a checkpoint carries
    save_student(old, tmp_path / "old")
    back = load_student(tmp_path / "old")
    assert back.dense_inputs == "layer_norm" and back.wide is None
    part = feed.take(torch.arange(32))
    torch.testing.assert_close(predict_student(back, part), predict_student(old, part))


def test_a_wide_path_needs_standardised_inputs(preset):  # noqa: F811
    with pytest.raises(ValueError, match="standardized"):
        make(preset, dense_inputs="layer_norm", wide=True)
    with pytest.raises(ValueError, match="dense_inputs"):
        make(preset, dense_inputs="batch_norm")

