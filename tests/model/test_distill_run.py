"""run_distillation: the report grid, KD effectiveness, selection on E-1, production students."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gem_model.distill import (
    ARMS,
    kd_effectiveness,
    load_student,
    run_distillation,
    score_student,
    select_student,
    train_production_student,
    write_report,
)
from gem_model.distill.arms import arm_paths
from gem_model.distill.export import example_inputs
from gem_model.distill.kd_intervals import TWO_GAINS
from gem_model.distill.run import KD_EPS, SPLITS

from .distill_fixtures import TINY, all_predictions, world  # noqa: F401

SURFACES = ["feed", "reels", "marketplace", "shops"]
FAST = {"train": {**TINY["train"], "max_steps": 12, "epochs": 1}}


@pytest.fixture(scope="module")
def report(world, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("students")
    rows = run_distillation(
        list(ARMS), ["direct", "hierarchical"], [0], SURFACES, teachers=world.teachers,
        teacher_predictions=all_predictions(world), preset="tiny", overrides=FAST, roles=world.roles,
        uri=world.te_uri, oracle_uri=f"{world.lake}/oracle", save_root=root,
    )
    return rows, root


def test_labels_only_report_keeps_an_earlier_selection(report, world, tmp_path):  # noqa: F811
    """Between teacher changes the daily report trains the labels_only floor alone on the new days and
    the earlier report's selection stands, with its day, arms and teachers; kept_accepted is today's."""
    rows, _ = report
    earlier = json.loads(write_report(rows, tmp_path / "full.json", teachers={"foundation": "v1"}).read_text())
    floor = run_distillation(["labels_only"], ["direct", "hierarchical"], [0], SURFACES, teachers=world.teachers,
                             preset="tiny", overrides=FAST, roles=world.roles, uri=world.te_uri,
                             oracle_uri=f"{world.lake}/oracle")
    assert {(r["arm"], r["path"]) for r in floor} == {("labels_only", "none")}
    assert {r["day"] for r in floor} == {world.roles.validation.isoformat(), world.roles.evaluation.isoformat()}
    incumbent = (earlier["selected"]["feed"]["arm"], earlier["selected"]["feed"]["path"])
    doc = json.loads(write_report(floor, tmp_path / "daily.json", incumbents={"feed": incumbent},
                                  selection_from=earlier).read_text())
    assert doc["arms"] == ["labels_only"] and doc["selection"] == earlier["selection"]
    assert doc["selection"]["teachers"] == {"foundation": "v1"} and doc["selection"]["arms"] == sorted(ARMS)
    assert {s: (v["arm"], v["path"]) for s, v in doc["selected"].items()} == {
        s: (v["arm"], v["path"]) for s, v in earlier["selected"].items()}
    assert doc["selected"]["feed"]["kept_accepted"] and not doc["selected"]["shops"]["kept_accepted"]


def test_report_has_every_arm_path_surface_split(report):
    rows, root = report
    have = {(r["arm"], r["path"], r["surface"], r["split"]) for r in rows}
    assert {(a, p, s, sp) for a in ARMS for p in arm_paths(a, ["direct", "hierarchical"]) for s in SURFACES
            for sp in SPLITS} <= have
    keys = {"arm", "path", "split", "surface", "task", "seed", "ne", "auc", "calibration", "oracle_ne",
            "kd_effectiveness", "n"}
    for r in rows:
        assert keys <= set(r)
        assert r["split"] in ("validation", "evaluation")
        assert (r["path"] == "none") == (r["arm"] == "labels_only")
        assert r["n"] > 0 and math.isfinite(r["ne"])
        assert r["oracle_ne"] is not None
    # reels logs no conversions: no conversion rows there
    assert not [r for r in rows if r["surface"] == "reels" and r["task"] == "conversion"]
    assert {r["task"] for r in rows if r["surface"] == "feed"} == {"click", "conversion"}
    # labels_only once per surface; every student was saved
    assert len({(r["surface"], r["seed"]) for r in rows if r["arm"] == "labels_only"}) == len(SURFACES)
    saved = sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/*/model.pt"))
    assert len(saved) == len(SURFACES) * (1 + 2 * (len(ARMS) - 1))
    assert "shops/parameter_sharing-hierarchical-s0" in saved
    cfg = json.loads((root / "shops/parameter_sharing-hierarchical-s0/config.json").read_text())
    assert cfg["key"]["teacher"] == "domain:commerce"
    assert cfg["student"]["teacher_emb_dim"] == 16


def test_kd_effectiveness_only_for_kd_arms(report):
    rows, _ = report
    assert all(r["kd_effectiveness"] is None for r in rows if r["arm"] in ("labels_only", "standard_kd")
               or r["task"] != "click")  # conversion rows included: the ratio is of the click task
    assert any(r["task"] == "conversion" for r in rows)
    kd = [r for r in rows if r["arm"] not in ("labels_only", "standard_kd") and "status" not in r
          and r["task"] == "click"]
    assert kd and all("kd_gain" in r and "kd_gain_standard" in r for r in kd)  # every trained KD cell: both gains
    for r in kd:  # a ratio exactly where standard KD gained measurably (on E: with its interval above 0)
        defined = r["kd_gain_standard"] > KD_EPS and r.get("kd_report") != TWO_GAINS
        assert (r["kd_effectiveness"] is not None) == defined, r
        if defined:
            assert r["kd_effectiveness"] == pytest.approx(r["kd_gain"] / r["kd_gain_standard"])


def _row(arm, path, ne, surface="s", split="validation", seed=0):
    return {"arm": arm, "path": path, "surface": surface, "split": split, "task": "click", "seed": seed, "ne": ne,
            "kd_effectiveness": None}


def test_kd_effectiveness_formula_and_zero_denominator():
    rows = [_row("labels_only", "none", 0.90), _row("labels_only", "none", 0.92, seed=1),
            _row("standard_kd", "direct", 0.89), _row("standard_kd", "direct", 0.89, seed=1),
            _row("aux_head", "direct", 0.87), _row("aux_head", "direct", 0.88, seed=1),
            _row("standard_kd", "hierarchical", 0.91), _row("aux_head", "hierarchical", 0.85)]
    kd_effectiveness(rows)
    aux = [r for r in rows if r["arm"] == "aux_head" and r["path"] == "direct"]
    assert all(r["kd_effectiveness"] == pytest.approx((0.91 - 0.875) / (0.91 - 0.89)) for r in aux)
    hier = [r for r in rows if r["arm"] == "aux_head" and r["path"] == "hierarchical"][0]
    assert hier["kd_effectiveness"] is None  # denominator ~0: standard KD did not beat labels-only
    assert hier["kd_gain"] == pytest.approx(0.06)


def test_selection_reads_only_the_validation_day(report):
    rows, _ = report
    for s in SURFACES:
        arm, path = select_student(rows, s)
        # make the evaluation day say something else: selection must not move
        rigged = [dict(r, ne=(0.0 if (r["split"] == "evaluation" and r["arm"] != arm) else r["ne"])) for r in rows]
        assert select_student(rigged, s) == (arm, path)
        val = {(r["arm"], r["path"]): r["ne"] for r in rows if r["surface"] == s and r["split"] == "validation"
               and r["task"] == "click"}
        assert val[(arm, path)] == min(val.values())


def test_selection_keeps_the_accepted_pair_unless_beaten_by_more_than_the_margin(report):
    rows, _ = report
    for s in SURFACES:
        val = {(r["arm"], r["path"]): r["ne"] for r in rows if r["surface"] == s and r["split"] == "validation"
               and r["task"] == "click"}
        best = select_student(rows, s)
        worst = max(val, key=val.get)
        gap = val[worst] - val[best]
        assert gap > 0
        assert select_student(rows, s, incumbent=worst, keep_within=gap) == worst  # within the margin: kept
        assert select_student(rows, s, incumbent=worst, keep_within=gap * 0.99) == best  # beaten: replaced
        assert select_student(rows, s, incumbent=("no_such_arm", "direct"), keep_within=1.0) == best
        # a validation day without a click on the surface ranks nothing: the accepted pair stays
        clickless = [{**r, "ne": float("nan")} if r["surface"] == s and r["split"] == "validation" else r for r in rows]
        assert select_student(clickless, s, incumbent=worst) == worst


def test_write_report(report, tmp_path):
    rows, _ = report
    p = write_report(rows, tmp_path / "distillation_report.json")
    doc = json.loads(p.read_text())
    assert set(doc["selected"]) == set(SURFACES)
    assert "parameter_sharing|hierarchical|evaluation" in doc["summary"]
    assert not any(v["kept_accepted"] for v in doc["selected"].values())
    incumbents = {s: ("labels_only", "none") for s in SURFACES}
    kept = json.loads(write_report(rows, tmp_path / "kept.json", incumbents=incumbents, keep_within=10.0).read_text())
    assert kept["selected"] == {s: {"arm": "labels_only", "path": "none", "kept_accepted": True} for s in SURFACES}
    assert kept["keep_accepted_within"] == 10.0
    # what made the selection: the validation day it ranked on, the arms it compared, the teachers
    assert doc["selection"] == {"on": next(r["day"] for r in rows if r["split"] == "validation"),
                                "arms": sorted(ARMS), "teachers": {}}
    # KD gains on E with paired bootstrap intervals, for every kd arm and surface
    for s in SURFACES:
        cell = doc["kd_intervals"][s]["arms"]["parameter_sharing|direct"]
        assert cell["gain_lo"] <= cell["gain"] <= cell["gain_hi"] and cell["report"] in ("ratio", "two gains")
        assert (cell["report"] == "ratio") == (cell["standard_gain_lo"] > 0)


def test_eval_rows_carry_gain_intervals_equal_to_the_row_gains(report):
    rows, _ = report
    ne = {(r["arm"], r["path"], r["surface"]): r["ne"] for r in rows if r["split"] == "evaluation"
          and r["task"] == "click"}
    judged = 0
    for r in rows:
        if r["split"] != "evaluation" or r["task"] != "click" or r["arm"] == "labels_only":
            assert "kd_gain_lo" not in r
            continue
        judged += 1
        assert r["kd_gain"] == pytest.approx(ne[("labels_only", "none", r["surface"])] - r["ne"])
        assert r["kd_gain_lo"] <= r["kd_gain"] <= r["kd_gain_hi"]
        if r.get("kd_report") == "two gains":
            assert r["kd_effectiveness"] is None
    assert judged >= len(SURFACES)  # every surface's kd arms were checked


def test_production_student_saved_loaded_exported(world, tmp_path):  # noqa: F811
    out = train_production_student(
        "shops", "parameter_sharing", "hierarchical", teachers=world.teachers,
        teacher_predictions=all_predictions(world), preset="tiny", overrides=FAST, roles=world.roles,
        uri=world.te_uri, oracle_uri=f"{world.lake}/oracle", root=tmp_path, version="v1",
    )
    d = tmp_path / "shops" / "v1"
    assert out["model_dir"] == str(d)
    assert {"model.pt", "config.json", "metrics.json", "student.pt2", "student.pt2.json"} <= {p.name for p in d.iterdir()}
    metrics = json.loads((d / "metrics.json").read_text())
    assert {r["split"] for r in metrics["rows"]} == {"validation", "evaluation"}
    assert metrics["train"]["adapter"]["fitted_dates"] == [world.roles.adapter.isoformat()]
    assert sorted(metrics["train"]["copied_tables"]) == ["advertiser", "item", "user"]
    student = load_student(d).eval()
    served = torch.export.load(str(d / "student.pt2")).module()
    args = example_inputs(student, 9)
    cal = student.calibrator  # its own map, fitted on E-1 and saved with it: serving applies it too
    assert cal.fit_day == world.roles.validation.isoformat() and cal.surfaces == ["shops"]
    with torch.no_grad():
        torch.testing.assert_close(served(*args), cal.apply_logits(student(*args), torch.zeros(9, dtype=torch.long)))
    sidecar = json.loads((d / "student.pt2.json").read_text())["calibration"]
    assert sidecar["a"] == pytest.approx(cal.a[0].tolist()) and sidecar["b"] == pytest.approx(cal.b[0].tolist())
    # the gate re-scores an ACCEPTED student on a day: the same rows as its own evaluation
    rescored = score_student(d, world.roles.evaluation, teacher_predictions=all_predictions(world), uri=world.te_uri,
                             oracle_uri=f"{world.lake}/oracle")
    saved = {(r["task"]): r for r in metrics["rows"] if r["split"] == "evaluation"}
    assert {r["task"] for r in rescored} == set(saved)
    for r in rescored:
        assert r["ne"] == pytest.approx(saved[r["task"]]["ne"], rel=1e-5)
        assert r["positives"] == saved[r["task"]]["positives"]


def test_production_student_warm_starts_from_the_accepted_one(world, tmp_path):  # noqa: F811
    """init_from: the new student starts from the saved weights when it is the same model; cold otherwise
    (with the reason), and an unreadable checkpoint is an error."""
    kw = dict(teachers=world.teachers, teacher_predictions=all_predictions(world), preset="tiny", roles=world.roles,
              uri=world.te_uri, oracle_uri=f"{world.lake}/oracle", root=tmp_path, export=False)
    first = train_production_student("shops", "labels_only", "none", version="v1", overrides=FAST, **kw)
    assert first["train"]["warm_start"] == "cold: no ACCEPTED student to start from"
    assert first["train"]["warm_start_from"] is None
    # lr 0: no step moves a weight, so what a student saves is what it started from
    frozen = {"train": {**FAST["train"], "lr": 0.0, "emb_lr": 0.0}}
    warm = train_production_student("shops", "labels_only", "none", version="v2", overrides=frozen, seed=1,
                                    init_from=first["model_dir"], **kw)
    cold = train_production_student("shops", "labels_only", "none", version="v3", overrides=frozen, **kw)
    assert warm["train"]["warm_start"] == "warm" and warm["train"]["warm_start_from"] == first["model_dir"]
    assert warm["train"]["folded_in"] == 0  # the same window: no item row the first student had not met
    assert cold["train"]["warm_start"] == "cold: no ACCEPTED student to start from"
    assert json.loads((tmp_path / "shops" / "v2" / "metrics.json").read_text())["train"]["warm_start"] == "warm"
    v1, v2, v3 = (load_student(tmp_path / "shops" / v).state_dict() for v in ("v1", "v2", "v3"))
    assert all(torch.equal(v1[k], v2[k]) for k in v1)
    assert not all(torch.equal(v1[k], v3[k]) for k in v1)  # the cold one starts from a fresh init
    ne = {(r["split"], r["task"]): r["ne"] for r in first["rows"]}
    assert {(r["split"], r["task"]): r["ne"] for r in warm["rows"]} == pytest.approx(ne, rel=1e-6)
    # another loss and teacher over the same network: still warm (arm, path and teacher steer training only)
    kd = train_production_student("shops", "standard_kd", "direct", version="v4", overrides=frozen,
                                  init_from=first["model_dir"], **kw)
    assert kd["train"]["warm_start"] == "warm"
    v4 = load_student(tmp_path / "shops" / "v4").state_dict()
    assert all(torch.equal(v1[k], v4[k]) for k in v1)
    # an arm that adds a head is another network: cold, naming the difference
    other = train_production_student("shops", "aux_head", "direct", version="v5", overrides=frozen,
                                     init_from=first["model_dir"], **kw)
    assert other["train"]["warm_start"].startswith("cold: the ACCEPTED student differs in aux_head=False")
    assert other["train"]["warm_start_from"] is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"bad/model\.pt: cannot load the ACCEPTED student"):
        train_production_student("shops", "labels_only", "none", version="v5", overrides=FAST,
                                 init_from=tmp_path / "bad", **kw)


def test_a_student_that_died_resumes_from_its_checkpoint(world, tmp_path):  # noqa: F811
    """Failed in its second epoch right after a checkpoint (kept in its version's folder), a production student
    called again with the same version continues from it to the weights and metrics of one never interrupted
    (the trainer's own test compares the loss curves)."""
    kw = dict(teachers=world.teachers, teacher_predictions=all_predictions(world), preset="tiny", roles=world.roles,
              uri=world.te_uri, oracle_uri=f"{world.lake}/oracle", root=tmp_path, export=False)
    train = {**TINY["train"], "max_steps": None, "epochs": 3, "checkpoint_every": 2}
    whole = train_production_student("feed", "parameter_sharing", "direct", version="whole",
                                     overrides={"train": train}, **kw)
    steps = whole["train"]["steps"]
    per_epoch = steps // 3
    fail = per_epoch + 2 + per_epoch % 2  # a checkpoint inside the second epoch, after the first epoch's selection
    assert per_epoch >= 3 and whole["train"]["resumed_from_step"] is None
    with pytest.raises(RuntimeError, match=f"simulated failure at step {fail}"):
        train_production_student("feed", "parameter_sharing", "direct", version="again",
                                 overrides={"train": {**train, "fail_at_step": fail}}, **kw)
    checkpoint = tmp_path / "feed" / "again" / "checkpoint-feed-parameter_sharing-direct-s0.pt"
    assert torch.load(checkpoint, weights_only=True)["step"] == fail
    resumed = train_production_student("feed", "parameter_sharing", "direct", version="again",
                                       overrides={"train": train}, **kw)
    assert resumed["checkpoint"] == str(checkpoint)
    assert (resumed["train"]["resumed_from_step"], resumed["train"]["steps"]) == (fail, steps)
    assert resumed["train"]["epoch_kept"] == whole["train"]["epoch_kept"]
    expected = load_student(whole["model_dir"]).state_dict()
    for k, v in load_student(resumed["model_dir"]).state_dict().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6, msg=k)
    ne = {(r["split"], r["task"]): r["ne"] for r in whole["rows"]}
    assert {(r["split"], r["task"]): r["ne"] for r in resumed["rows"]} == pytest.approx(ne, rel=1e-5)
