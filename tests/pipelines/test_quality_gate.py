from __future__ import annotations

import dagster as dg
import pytest

from gem_pipelines import quality_gate
from gem_pipelines.quality_gate import gate
from gem_pipelines.settings import ModelGate

CFG = ModelGate(min_positives=100, max_ne=1.0, max_regression=0.02)


def row(surface: str, ne: float, positives: int = 500, task: str = "click") -> dict:
    return {"surface": surface, "task": task, "ne": ne, "positives": positives}


def test_gate_passes_good_models_and_ignores_pairs_with_few_positives() -> None:
    result = gate([row("feed", 0.9), row("shops", 1.3, positives=20)], None, CFG)
    assert result["passed"] and [p["surface"] for p in result["gated_pairs"]] == ["feed"]


def test_gate_fails_ne_above_one_and_regressions_against_accepted() -> None:
    assert not gate([row("feed", 1.01)], None, CFG)["passed"]
    regressed = gate([row("feed", 0.93)], [row("feed", 0.90)], CFG)
    assert not regressed["passed"] and "regressed" in regressed["failures"][0]["why"]
    assert gate([row("feed", 0.915)], [row("feed", 0.90)], CFG)["passed"]


def test_gate_with_nothing_to_gate_does_not_pass_silently() -> None:
    result = gate([row("feed", 0.9, positives=3)], None, CFG)
    assert not result["passed"] and "positives" in result["note"]
    # a per-surface model of a surface too small to judge on one day passes, and says so
    small = gate([row("shops", 1.3, positives=3)], None, CFG, allow_ungated=True)
    assert small["passed"] and not small["gated_pairs"] and "not judged" in small["note"]


def test_student_worse_than_labels_only_fails() -> None:
    labels_only = [row("feed", 0.90), row("reels", 0.90)]
    ok = gate([row("feed", 0.91), row("reels", 0.85)], None, CFG, reference=labels_only)
    assert ok["passed"]
    worse = gate([row("feed", 0.93), row("reels", 0.85)], None, CFG, reference=labels_only)
    assert not worse["passed"] and "labels_only" in worse["failures"][0]["why"]
    assert not gate([row("shops", 0.8)], None, CFG, reference=labels_only)["passed"]  # nothing to compare with


def test_accepted_only_by_a_passing_gate_and_compared_on_the_same_day(gem_home) -> None:
    from gem_model.models.registry import new_version, read_accepted, version_dir

    passing, failing = new_version(), new_version()
    for v, ne in ((passing, 0.9), (failing, 1.2)):
        version_dir("students", v, "feed").mkdir(parents=True)
        verdict = gate([row("feed", ne)], None, CFG)
        quality_gate.record(version_dir("students", v, "feed"), verdict, [row("feed", ne)], "2026-11-07")
        assert quality_gate.accept("students", v, verdict, "feed") == verdict["passed"]
    assert read_accepted("students", "feed").name == passing
    assert quality_gate.accepted_rows("students", "2026-11-07", "feed") == [row("feed", 0.9)]
    # the window moved: the accepted version is re-scored on the new E, or nothing is comparable
    assert quality_gate.accepted_rows("students", "2026-11-08", "feed") is None
    rescored = quality_gate.accepted_rows("students", "2026-11-08", "feed", rescore=lambda d: [row("feed", 0.95)])
    assert rescored == [row("feed", 0.95)]


def test_every_accepted_file_traces_to_a_passing_check_in_the_event_log(gem_home) -> None:
    """The asset pattern (materialize, yield the check, then accept) leaves an event-log trace;
    an ACCEPTED written any other way is reported."""
    from gem_model.models.registry import new_version, version_dir

    parts = dg.StaticPartitionsDefinition(["feed", "shops"])
    ne = {"feed": 0.9, "shops": 1.5}

    @dg.asset(name="students", partitions_def=parts, check_specs=[
        dg.AssetCheckSpec(quality_gate.CHECK, asset="students", blocking=False, partitions_def=parts)])
    def fake_students(context):  # unannotated: a string annotation in a local scope does not resolve
        version = new_version(context.run_id)
        version_dir("students", version, context.partition_key).mkdir(parents=True)
        rows = [row(context.partition_key, ne[context.partition_key])]
        verdict = gate(rows, None, CFG)
        yield dg.MaterializeResult(metadata={"version": version})
        yield quality_gate.check_result(verdict, version, "2026-11-07")
        quality_gate.accept("students", version, verdict, context.partition_key)

    with dg.DagsterInstance.ephemeral() as instance:
        for key in ("feed", "shops"):
            dg.materialize([fake_students], partition_key=key, instance=instance)
        accepted = sorted(p.parent.name for p in (gem_home / "models").glob("**/ACCEPTED"))
        assert accepted == ["feed"]  # the failing gate wrote nothing
        assert quality_gate.untraced_accepted(instance, gem_home) == []
        rogue = new_version()
        version_dir("students", rogue, "shops").mkdir(parents=True)
        (gem_home / "models" / "students" / "shops" / "ACCEPTED").write_text(rogue + "\n")
        assert quality_gate.untraced_accepted(instance, gem_home) == [str(gem_home / "models/students/shops/ACCEPTED")]


def test_a_model_accepted_unjudged_shows_a_warning_not_a_green_pass(gem_home) -> None:
    """No pair with enough positives: the version is accepted (a small surface still gets a model),
    and its check says "not judged" as a WARN failure, which blocks nothing and still traces ACCEPTED."""
    from gem_model.models.registry import new_version, read_accepted, version_dir

    parts = dg.StaticPartitionsDefinition(["shops"])

    @dg.asset(name="students", partitions_def=parts, check_specs=[
        dg.AssetCheckSpec(quality_gate.CHECK, asset="students", blocking=True, partitions_def=parts)])
    def fake_students(context):
        version = new_version(context.run_id)
        version_dir("students", version, "shops").mkdir(parents=True)
        verdict = gate([row("shops", 0.95, positives=12)], None, CFG, allow_ungated=True)
        yield dg.MaterializeResult(metadata={"version": version})
        yield quality_gate.check_result(verdict, version, "2026-11-07")
        quality_gate.accept("students", version, verdict, "shops")

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize([fake_students], partition_key="shops", instance=instance)
        assert result.success  # a WARN failure of a blocking check fails no step
        (evaluation,) = result.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
        assert evaluation.description.startswith("not judged: no (surface, task) pair with >= 100 positives")
        assert evaluation.metadata["judged"].value is False and evaluation.metadata["gated_pairs"].value == 0
        assert read_accepted("students", "shops") is not None
        assert quality_gate.untraced_accepted(instance, gem_home) == []
    # a judged pass stays a plain pass
    judged = quality_gate.check_result(gate([row("feed", 0.9)], None, CFG), "v", "2026-11-07")
    assert judged.passed and judged.severity == dg.AssetCheckSeverity.ERROR and judged.metadata["judged"].value is True


def _gated_model(broken: bool) -> dg.AssetsDefinition:
    """A model whose blocking gate refuses it; `broken`: and a step error after the refusal."""

    @dg.asset(name="model", check_specs=[dg.AssetCheckSpec("quality_gate", asset="model", blocking=True)])
    def model():
        yield dg.MaterializeResult()
        yield dg.AssetCheckResult(passed=False, check_name="quality_gate", severity=dg.AssetCheckSeverity.ERROR)
        if broken:
            raise RuntimeError("disk full")

    return model


@dg.asset
def _child(model):  # runs only if the gate passes
    return 1


def test_a_gate_refusal_is_told_apart_from_a_broken_run() -> None:
    """`make next-day` goes on after a gate refuses a model (the accepted one keeps serving) and stops
    on any other failure, a failed gate beside a broken step included."""
    from gem_pipelines.next_day import rejected_by_gate

    instance = dg.DagsterInstance.ephemeral()
    for broken, refused in ((False, True), (True, False)):
        result = dg.materialize([_gated_model(broken), _child], instance=instance, raise_on_error=False)
        assert not result.success and rejected_by_gate(instance, result.run_id) == refused
    passing = dg.materialize([dg.asset(name="other")(lambda: 1)], instance=instance)
    assert passing.success and not rejected_by_gate(instance, passing.run_id)


def test_the_demo_lists_a_gate_refusal_and_stops_on_a_broken_run(capsys) -> None:
    """`make demo` goes on past a model its gate refused (listed at the end) and stops on a broken run, and
    on a refused run that is not a model's (a blocking data check)."""
    from gem_pipelines import demo

    instance = dg.DagsterInstance.ephemeral()
    runs = {broken: dg.materialize([_gated_model(broken), _child], instance=instance, raise_on_error=False).run_id
            for broken in (False, True)}

    class Location:  # launches nothing: hands back the run already made for the "job"
        def __init__(self) -> None:
            self.instance = instance

        def launch(self, job: str, **_: object) -> dg.DagsterRun:
            return instance.get_run_by_id(runs[job == "broken_job"])

    assert demo._run(Location(), "students_job", "feed", model=True) is True
    assert "REFUSED by its quality gate" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="land_and_ingest_job  failed"):  # a data check's refusal stops it
        demo._run(Location(), "land_and_ingest_job")
    with pytest.raises(SystemExit, match="broken_job  failed"):
        demo._run(Location(), "broken_job", model=True)


def _small_surface_rows(p_click: float, p_clicked: float | None = None) -> list[dict]:
    """metric_rows of a surface with about 15 clicks in 1,000 rows, every row predicted `p_click` (the clicked
    ones `p_clicked` where given: a model with some signal)."""
    import numpy as np
    import polars as pl

    from gem_model.eval.metrics import metric_rows

    y = np.random.default_rng(0).random(1000) < 0.015
    preds = pl.DataFrame({"request_id": [str(i) for i in range(1000)], "surface": ["shops"] * 1000,
                          "click": y.astype(np.float32), "click_mask": [True] * 1000,
                          "p_click": np.where(y, p_clicked or p_click, p_click),
                          "conversion": [0.0] * 1000, "conversion_mask": [False] * 1000,
                          "p_conversion": [0.0] * 1000})
    return metric_rows(preds)


def test_a_small_surface_is_refused_only_on_evidence() -> None:
    """Too few clicks to judge a point estimate (min_positives), but a model whose whole NE interval lies
    above the base rate is refused on that evidence; one whose interval reaches below it is still accepted
    unjudged. (A constant prediction is never below the base rate of the rows it is scored on.)"""
    bad = _small_surface_rows(0.2)
    lo, hi = bad[0]["ne_interval"]
    assert 0 < bad[0]["positives"] < CFG.min_positives and 1.0 < lo < bad[0]["ne"] < hi
    refused = gate(bad, None, CFG, allow_ungated=True)
    assert not refused["passed"] and refused["judged"] and "on evidence" in refused["failures"][0]["why"]
    near = _small_surface_rows(0.014, p_clicked=0.03)
    assert near[0]["ne_interval"][0] < 1.0
    accepted = gate(near, None, CFG, allow_ungated=True, reference=[])
    assert accepted["passed"] and not accepted["judged"] and "not judged" in accepted["note"]
