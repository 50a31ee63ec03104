"""gem_model.distill: arms train, aux-head isolation, Student Adapter dates, representation
alignment, parameter sharing, teacher table contract, export round trip."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from gem_model.config import load_features, load_surfaces
from gem_model.data.loader import date_range
from gem_model.distill import (
    ARMS,
    TEACHER_PREDICTIONS_SCHEMA,
    Student,
    StudentAdapter,
    attach_teacher,
    export_student,
    load_examples,
    load_student_preset,
    student_config,
    train_student,
)
from gem_model.distill.export import ServingStudent, example_inputs
from gem_model.distill.teacher import FOUNDATION, domain_teacher
from gem_model.distill.trainer import arm_loss, kd_target, student_inputs

from .distill_fixtures import TINY, all_predictions, world  # noqa: F401

SURFACE = "feed"


@pytest.fixture(scope="module")
def preset():
    return load_student_preset("tiny", overrides=TINY)


@pytest.fixture(scope="module")
def feed(world):  # noqa: F811
    idx = load_surfaces().names.index(SURFACE)
    data = load_examples(date_range(world.roles.student[0], world.roles.evaluation), [SURFACE], hist_k=8,
                         uri=world.te_uri)
    data = attach_teacher(data, all_predictions(world), FOUNDATION)
    assert bool((data.surface_idx == idx).all())
    return data


def make_student(arm: str, preset, teacher_emb_dim: int = 16) -> Student:
    spec = ARMS[arm]
    cfg = student_config(preset["student"], features=load_features(), teacher_d_model=32, surface=SURFACE,
                         tasks=["click", "conversion"], aux_head=spec["kd"] == "aux",
                         teacher_emb_dim=teacher_emb_dim if spec["representation"] else 0)
    return Student(cfg)


def test_teacher_predictions_contract(world):  # noqa: F811
    tp = all_predictions(world)
    assert dict(tp.schema) == {k: v for k, v in TEACHER_PREDICTIONS_SCHEMA.items()}
    assert tp.select("request_id", "teacher").is_duplicated().sum() == 0
    assert set(tp["teacher"].unique()) == {FOUNDATION, domain_teacher("social"), domain_teacher("commerce")}
    # a domain teacher covers exactly its domain's surfaces
    commerce = tp.filter(pl.col("teacher") == domain_teacher("commerce"))
    assert set(commerce["surface"].unique()) == {"marketplace", "shops"}
    # conversion-less surfaces carry no conversion prediction
    reels = tp.filter(pl.col("surface") == "reels")
    assert reels["p_conversion"].null_count() == reels.height
    assert tp["p_click"].is_between(0, 1).all()
    assert tp["embedding"].list.len().unique().to_list() == [16]


def test_rewrite_replaces_only_its_slice(world, tmp_path):  # noqa: F811
    from gem_model.distill.teacher import read_teacher_predictions, write_teacher_predictions

    uri = str(tmp_path / "tp")
    tp = all_predictions(world)
    write_teacher_predictions(tp, uri=uri)
    d = world.roles.adapter
    again = tp.filter((pl.col("date") == d) & (pl.col("teacher") == FOUNDATION)).with_columns(
        pl.lit("f2").alias("teacher_version"))
    write_teacher_predictions(again, uri=uri)
    back = read_teacher_predictions(uri=uri)
    assert back.height == tp.height
    versions = back.filter(pl.col("teacher") == FOUNDATION).group_by("date").agg(pl.col("teacher_version").unique())
    got = {r[0]: sorted(r[1]) for r in versions.rows()}
    assert got[d] == ["f2"] and all(v == ["f1"] for k, v in got.items() if k != d)


@pytest.mark.parametrize("arm", list(ARMS))
def test_every_arm_trains_and_loss_falls(arm, feed, preset, world):  # noqa: F811
    train = feed.on_dates(date_range(*world.roles.student))
    val = feed.on_dates([world.roles.validation])
    student = make_student(arm, preset)
    adapter = None
    if ARMS[arm]["adapter"]:
        adapter = StudentAdapter([0, 3], ["position", "hour_of_day"]).fit(train, world.roles.adapter)
    cfg = {**preset["train"], "epochs": 3, "max_steps": 45}
    info = train_student(student, train, val, arm, cfg, seed=0, adapter=adapter, teacher_model=world.foundation)
    losses = np.asarray(info["losses"])
    assert len(losses) >= 20
    assert losses[-8:].mean() < losses[:4].mean(), (arm, losses[:4], losses[-8:])
    assert info["epoch_kept"] >= 0


def test_a_warm_start_keeps_its_weights_when_training_makes_e1_worse(feed, preset, world):  # noqa: F811
    """keep_start: the starting weights are a candidate of the E-1 selection. A trained student retrained
    at a rate that wrecks it (every weight moved by ~lr by the fresh Adam) comes back unchanged with
    epoch_kept -1; without keep_start the wrecked weights are what it keeps."""
    from gem_model.distill.trainer import click_logloss, predict_student

    train = feed.on_dates(date_range(*world.roles.student))
    val = feed.on_dates([world.roles.validation])
    cfg = {**preset["train"], "epochs": 2, "max_steps": 30}
    base = make_student("labels_only", preset)
    train_student(base, train, val, "labels_only", cfg, seed=0)
    start = {k: v.clone() for k, v in base.state_dict().items()}
    ll_start = click_logloss(predict_student(base, val, calibrated=False), val)
    wreck = {**cfg, "lr": 5.0, "emb_lr": 5.0, "epochs": 1, "max_steps": 5}

    kept = make_student("labels_only", preset)
    kept.load_state_dict(start)
    info = train_student(kept, train, val, "labels_only", wreck, seed=1, keep_start=True)
    assert info["epoch_kept"] == -1 and info["val_click_logloss"] == pytest.approx(ll_start)
    assert all(torch.equal(v, start[k]) for k, v in kept.state_dict().items())

    lost = make_student("labels_only", preset)
    lost.load_state_dict(start)
    info = train_student(lost, train, val, "labels_only", wreck, seed=1)
    assert info["epoch_kept"] == 0 and info["val_click_logloss"] > ll_start


def test_aux_head_loss_never_reaches_serving_head(feed, preset):
    student = make_student("aux_head", preset)
    part = feed.take(np.arange(256))
    serving, aux = student.forward_train(*student_inputs(student, part))
    target = part.teacher_p
    from gem_model.distill.trainer import masked_bce

    aux_loss = masked_bce(aux, target, part.label_mask & ~torch.isnan(target))
    student.zero_grad()
    aux_loss.backward()
    serving = student.serving_head_parameters()
    assert serving
    for p in serving:
        assert p.grad is None or torch.count_nonzero(p.grad) == 0
    assert any(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in student.aux.parameters())
    assert any(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in student.trunk.parameters())

    # and the full aux_head arm loss: its serving-head gradient equals the label-only gradient
    student.zero_grad()
    loss, _ = arm_loss(student, part, "aux_head", 1.0, target)
    loss.backward()
    g_arm = [p.grad.clone() for p in student.serving_head_parameters()]
    student.zero_grad()
    loss, _ = arm_loss(student, part, "labels_only", 1.0, None)
    loss.backward()
    for a, b in zip(g_arm, [p.grad for p in student.serving_head_parameters()], strict=True):
        torch.testing.assert_close(a, b)


def test_standard_kd_distils_into_the_serving_head(feed, preset):
    student = make_student("standard_kd", preset)
    part = feed.take(np.arange(256))
    student.zero_grad()
    arm_loss(student, part, "standard_kd", 1.0, part.teacher_p)[0].backward()
    g_kd = student.head.weight.grad.clone()
    student.zero_grad()
    arm_loss(student, part, "labels_only", 1.0, None)[0].backward()
    assert not torch.allclose(g_kd, student.head.weight.grad)
    assert student.aux is None


def test_student_adapter_sees_only_the_freshest_day(feed, world):  # noqa: F811
    train = feed.on_dates(date_range(*world.roles.student))
    assert len(train.date_set) >= 2
    adapter = StudentAdapter([0, 3], ["position", "hour_of_day"]).fit(train, world.roles.adapter)
    assert adapter.fitted_dates == [world.roles.adapter]
    assert adapter.to_dict()["fitted_dates"] == [world.roles.adapter.isoformat()]
    assert adapter.stats["click"]["n"] == len(train.on_dates([world.roles.adapter]))
    target = kd_target(train, adapter)
    assert target.shape == train.teacher_p.shape
    assert torch.equal(torch.isnan(target), torch.isnan(train.teacher_p))
    # labels of other days do not move the fit
    flipped = train.on_dates([world.roles.student[0]])
    flipped.labels[:] = 1 - flipped.labels
    from gem_model.distill.dataset import StudentData

    other = StudentAdapter([0, 3], ["position", "hour_of_day"]).fit(
        StudentData.concat([flipped, train.on_dates([world.roles.adapter])]), world.roles.adapter)
    assert other.coef == adapter.coef


def test_representation_inputs_align_by_request_id(world):  # noqa: F811
    data = load_examples([world.roles.validation], ["feed", "shops"], hist_k=4, uri=world.te_uri)
    tp = all_predictions(world)
    shuffled = tp.sample(fraction=1.0, shuffle=True, seed=1)
    a = attach_teacher(data, tp, FOUNDATION)
    b = attach_teacher(data, shuffled, FOUNDATION)
    assert torch.equal(a.teacher_emb, b.teacher_emb) and torch.equal(torch.nan_to_num(a.teacher_p), torch.nan_to_num(b.teacher_p))
    # row i carries the embedding of request_ids[i]
    lookup = {r: e for r, e in zip(tp.filter(pl.col("teacher") == FOUNDATION)["request_id"].to_list(),
                                   tp.filter(pl.col("teacher") == FOUNDATION)["embedding"].to_list(), strict=True)}
    for i in np.random.default_rng(0).choice(len(data), 20, replace=False):
        np.testing.assert_allclose(b.teacher_emb[i].numpy(), np.asarray(lookup[data.request_ids[i]], np.float32))
    # a teacher without predictions for these rows is an error, not silent zeros
    with pytest.raises(KeyError):
        attach_teacher(data, tp, domain_teacher("social"))


@pytest.mark.parametrize("teacher_key", ["foundation", "domain:commerce"])
def test_parameter_sharing_copies_exactly_the_named_tables(teacher_key, feed, preset, world):  # noqa: F811
    teacher = world.teachers[teacher_key]
    student = make_student("parameter_sharing", preset)
    before = {k: v.weight.detach().clone() for k, v in student.tables.items()}
    cfg = {**preset["train"], "max_steps": 1, "lr": 0.0, "emb_lr": 0.0, "share_tables": ["item", "user", "advertiser"]}
    train = feed.on_dates([world.roles.adapter])
    adapter = StudentAdapter([0], ["position"]).fit(train, world.roles.adapter)
    info = train_student(student, train, None, "parameter_sharing", cfg, adapter=adapter, teacher_model=teacher)
    assert sorted(info["copied_tables"]) == ["advertiser", "item", "user"]
    for name, emb in student.tables.items():
        if name in info["copied_tables"]:
            assert torch.equal(emb.weight, teacher.tables[name].weight), name
        else:
            assert torch.equal(emb.weight, before[name]), name
            assert not torch.equal(emb.weight, teacher.tables[name].weight), name
    # other arms copy nothing
    plain = make_student("representation", preset)
    info = train_student(plain, train, None, "representation", cfg, adapter=adapter, teacher_model=teacher)
    assert info["copied_tables"] == []


@pytest.mark.parametrize("arm", ["labels_only", "representation"])
def test_export_round_trip(arm, preset, tmp_path):
    student = make_student(arm, preset).eval()
    path = export_student(student, tmp_path / "student.pt2")
    loaded = torch.export.load(str(path)).module()
    for b in (1, 5, 64):
        args = example_inputs(student, b)
        with torch.no_grad():
            torch.testing.assert_close(loaded(*args), ServingStudent(student)(*args))
            torch.testing.assert_close(loaded(*args), torch.sigmoid(student(*args)))
    import json

    meta = json.loads((tmp_path / "student.pt2.json").read_text())
    assert [i["name"] for i in meta["inputs"]][:2] == ["dense", "sparse"]


def test_a_student_that_died_resumes_from_its_checkpoint(feed, preset, world, tmp_path):  # noqa: F811
    """Failed in its second epoch right after a checkpoint, train_student called again with that checkpoint
    continues to the losses, selection and weights of a run never interrupted (the epoch's batch order, both
    optimizers and the best epoch so far restored)."""
    train = feed.on_dates(date_range(*world.roles.student))
    val = feed.on_dates([world.roles.validation])
    cfg = {**preset["train"], "epochs": 3, "max_steps": None, "checkpoint_every": 2}

    def student() -> Student:
        torch.manual_seed(0)  # the same initial weights each time
        return make_student("aux_head", preset)

    whole = student()
    expected = train_student(whole, train, val, "aux_head", cfg, seed=0)
    per_epoch = expected["steps"] // 3
    fail = per_epoch + 2 + per_epoch % 2  # a checkpoint inside the second epoch, after the first epoch's selection
    assert per_epoch >= 3 and expected["resumed_from_step"] is None
    checkpoint = tmp_path / "checkpoint.pt"
    with pytest.raises(RuntimeError, match=f"simulated failure at step {fail}"):
        train_student(student(), train, val, "aux_head", {**cfg, "fail_at_step": fail}, seed=0, checkpoint=checkpoint)
    resumed = student()
    info = train_student(resumed, train, val, "aux_head", cfg, seed=0, checkpoint=checkpoint)
    assert (info["resumed_from_step"], info["steps"]) == (fail, expected["steps"])
    assert info["losses"] == pytest.approx(expected["losses"], rel=1e-5)  # the failed run's, then the same rest
    assert (info["epoch_kept"], info["val_click_logloss"]) == (expected["epoch_kept"],
                                                                pytest.approx(expected["val_click_logloss"]))
    for k, v in resumed.state_dict().items():
        torch.testing.assert_close(v, whole.state_dict()[k], rtol=1e-5, atol=1e-6, msg=k)
    # failed at its last step (max_steps), after that step's checkpoint: resumed, it trains no step more
    capped = {**cfg, "max_steps": fail}
    expected = train_student(student(), train, val, "aux_head", capped, seed=0)
    checkpoint.unlink()
    with pytest.raises(RuntimeError, match=f"simulated failure at step {fail}"):
        train_student(student(), train, val, "aux_head", {**capped, "fail_at_step": fail}, seed=0, checkpoint=checkpoint)
    info = train_student(student(), train, val, "aux_head", capped, seed=0, checkpoint=checkpoint)
    assert (info["resumed_from_step"], info["steps"]) == (fail, fail) and info["losses"] == expected["losses"]
