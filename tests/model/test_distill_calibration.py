"""Every model stores and applies its own calibrator: a domain model fits its map on E-1 after
training (never the foundation's, which it was copied from), saves it, and what its gate scores in
memory equals what a re-score of the saved version gives; the gate compares like with like."""

from __future__ import annotations

import copy
import datetime as dt

import pytest
import torch

from gem_model.config import load_surfaces
from gem_model.data.loader import ExampleStream
from gem_model.distill.domain import save_domain_model, train_domain_model
from gem_model.distill.teacher import FOUNDATION, predict_teacher, read_teacher_predictions
from gem_model.eval.metrics import evaluate_day, predict
from gem_model.models.calibration import Calibrator
from gem_model.models.registry import load_model

from .distill_fixtures import TINY, world  # noqa: F401


def test_domain_model_fits_saves_and_applies_its_own_calibrator(world, tmp_path):  # noqa: F811
    foundation = copy.deepcopy(world.foundation)
    names = [s.name for s in load_surfaces().in_domain("commerce")]
    odd = Calibrator.identity(list(foundation.cfg.surfaces))
    odd.a[:] = 0.2  # a map no fit would give: if the domain model kept it, it would show
    foundation.calibrator = odd
    tp = read_teacher_predictions(uri=world.tp_uri)
    model, info = train_domain_model("commerce", foundation, teacher_predictions=tp.filter(tp["teacher"] == FOUNDATION),
                                     dates=world.roles.student, preset="tiny", overrides=TINY, uri=world.te_uri)
    cal = model.calibrator
    assert cal is not odd and cal.fit_day == world.roles.validation.isoformat()
    assert foundation.calibrator is odd  # the foundation is left as it was
    i = {s: k for k, s in enumerate(cal.surfaces)}
    assert all(bool(cal.fitted[i[s], 0]) for s in names)
    others = [s for s in cal.surfaces if s not in names]
    assert others and not any(bool(cal.fitted[i[s]].any()) for s in others)  # never scored there: identity
    assert info["calibration"]["fit_day"] == cal.fit_day

    path = save_domain_model(model, info, version="v1", root=tmp_path)
    assert torch.load(path, weights_only=True)["calibration"]["fit_day"] == cal.fit_day
    loaded, _ = load_model(path)
    torch.testing.assert_close(loaded.calibrator.a, cal.a)
    # the gate's rows in memory and a re-score of the saved version: the same calibrated model
    day = world.roles.evaluation
    kw = dict(uri=world.te_uri, oracle_uri=f"{world.lake}/oracle")
    fresh = {(r["surface"], r["task"]): r for r in evaluate_day(model, day, names, **kw)}
    again = {(r["surface"], r["task"]): r for r in evaluate_day(loaded, day, names, **kw)}
    assert fresh and fresh.keys() == again.keys()
    for k, r in fresh.items():
        assert r["calibration_raw"] is not None  # scored through its calibrator
        assert again[k]["ne"] == pytest.approx(r["ne"], rel=1e-5)
    # the hierarchical path's targets are its calibrated probabilities
    targets = predict_teacher(loaded, [world.roles.validation], "domain:commerce", "v1", surfaces=names, uri=world.te_uri)
    d = world.roles.validation
    preds = predict(loaded, ExampleStream(d, d, names, batch_size=4096, uri=world.te_uri, shuffle=False,
                                          max_len=loaded.cfg.seq_len))
    joined = targets.select("request_id", "p_click").join(preds.select("request_id", "p_click", "p_click_raw"),
                                                          on="request_id")
    assert joined.height == preds.height
    assert (joined["p_click"] - joined["p_click_right"]).abs().max() < 1e-5
    assert (joined["p_click"] - joined["p_click_raw"]).abs().max() > 1e-4


def test_a_domain_model_that_died_resumes_from_its_checkpoint(world, tmp_path):  # noqa: F811
    """Failed after its step-4 checkpoint, a domain model's training continues from it to the weights of a run
    never killed (the same batches in the same order, the optimizer's state and the RNG restored)."""
    tp = read_teacher_predictions(uri=world.tp_uri)
    kw = dict(teacher_predictions=tp.filter(tp["teacher"] == FOUNDATION), dates=world.roles.student, preset="tiny",
              uri=world.te_uri)
    over = {**TINY, "domain": {"max_steps": 6, "checkpoint_every": 2}}
    whole, whole_info = train_domain_model("commerce", world.foundation, overrides=over, **kw)
    assert whole_info["steps"] > 4 and whole_info["resumed_from_step"] is None
    ck = tmp_path / "checkpoint.pt"
    with pytest.raises(RuntimeError, match="simulated failure at step 4"):
        train_domain_model("commerce", world.foundation, overrides={**over, "domain": {**over["domain"], "fail_at_step": 4}},
                           checkpoint=ck, **kw)
    assert torch.load(ck, weights_only=True)["step"] == 4
    resumed, info = train_domain_model("commerce", world.foundation, overrides=over, checkpoint=ck, **kw)
    assert (info["resumed_from_step"], info["steps"]) == (4, whole_info["steps"])
    assert info["losses"] == pytest.approx(whole_info["losses"], rel=1e-5)  # the killed run's four, then the rest
    expected = whole.state_dict()
    for k, v in resumed.state_dict().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6, msg=k)
    # failed at its last step (max_steps 4), after that step's checkpoint: resumed, it trains no step more
    ck.unlink()
    capped = {**TINY, "domain": {"max_steps": 4, "checkpoint_every": 2}}
    with pytest.raises(RuntimeError, match="simulated failure at step 4"):
        train_domain_model("commerce", world.foundation,
                           overrides={**capped, "domain": {**capped["domain"], "fail_at_step": 4}}, checkpoint=ck, **kw)
    _, info = train_domain_model("commerce", world.foundation, overrides=capped, checkpoint=ck, **kw)
    assert (info["resumed_from_step"], info["steps"]) == (4, 4)
    assert info["losses"] == pytest.approx(whole_info["losses"][:4], rel=1e-5)


def test_gate_compares_a_calibrated_model_with_an_uncalibrated_accepted_one_on_raw_ne():
    from gem_pipelines.quality_gate import gate
    from gem_pipelines.settings import ModelGate

    cfg = ModelGate(min_positives=10, max_ne=1.0, max_regression=0.01, max_vs_labels_only=0.05)
    new = [{"surface": "feed", "task": "click", "ne": 0.90, "ne_raw": 0.95, "calibration_raw": 1.2, "positives": 50}]
    raw_prev = [{"surface": "feed", "task": "click", "ne": 0.925, "ne_raw": None, "calibration_raw": None, "positives": 50}]
    v = gate(new, raw_prev, cfg)  # 0.95 raw vs 0.925 raw: a regression the calibrated 0.90 would hide
    assert not v["passed"] and v["gated_pairs"][0]["compared"] == "raw"
    cal_prev = [{"surface": "feed", "task": "click", "ne": 0.905, "ne_raw": 0.92, "calibration_raw": 1.1, "positives": 50}]
    v = gate(new, cal_prev, cfg)
    assert v["passed"] and v["gated_pairs"][0]["compared"] == "calibrated"


def test_refit_days_follow_the_scored_day_and_never_reach_a_training_day():
    from gem_model.models.calibration import refit_days

    d = dt.date(2026, 11, 7)
    fit = "2026-11-05,2026-11-06"  # the map of a model whose window ends 11-04, E = 11-07
    assert refit_days(d, fit) is None and refit_days(d - dt.timedelta(days=3), fit) is None  # its own E, its window
    assert refit_days(d + dt.timedelta(days=1), fit) == [dt.date(2026, 11, 6), dt.date(2026, 11, 7)]
    assert refit_days(d + dt.timedelta(days=5), fit) == [dt.date(2026, 11, 10), dt.date(2026, 11, 11)]
    assert refit_days(d + dt.timedelta(days=1), "2026-11-06") == [dt.date(2026, 11, 7)]  # as many days as its own
    assert refit_days(d, None) is None


def test_a_day_past_the_map_is_scored_behind_a_map_refitted_on_the_days_before_it(world):  # noqa: F811
    foundation = copy.deepcopy(world.foundation)
    stale = Calibrator.identity(list(foundation.cfg.surfaces))
    stale.b[:] = 1.5  # a known miscalibration: odds x4.5 on every head
    e, v = world.roles.evaluation, world.roles.validation
    stale.fitted[:], stale.fit_day = True, (v - dt.timedelta(days=1)).isoformat()  # E is two days past it
    foundation.calibrator = stale

    def mean_p(day, recalibrate):
        return predict_teacher(foundation, [day], FOUNDATION, "f", uri=world.te_uri, recalibrate=recalibrate)

    served, refitted = mean_p(e, False), mean_p(e, True)
    assert foundation.calibrator is stale  # the stored map is kept; the re-fitted one served this day only
    clicks = predict(foundation, ExampleStream(e, e, None, batch_size=4096, uri=world.te_uri, shuffle=False,
                                               max_len=foundation.cfg.seq_len))
    rate = float(clicks.filter(clicks["click_mask"])["click"].mean())
    assert served["p_click"].mean() > 2 * rate  # the stale map over-predicts
    assert abs(refitted["p_click"].mean() / rate - 1) < 0.5 * abs(served["p_click"].mean() / rate - 1)
    # monotone per surface: each surface's ranking is the served one
    both = served.join(refitted.select("request_id", "p_click"), on="request_id")
    for s in both["surface"].unique():
        sub = both.filter(both["surface"] == s)
        assert sub.sort("p_click")["p_click_right"].diff().drop_nulls().min() >= -1e-9
    # the day right after the map's own days keeps it: nothing newer to fit on
    assert mean_p(v, True)["p_click"].equals(mean_p(v, False)["p_click"])
