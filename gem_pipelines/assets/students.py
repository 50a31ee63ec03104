"""Post-training: domain foundation models, the shared teacher-predictions cache, the distillation
report (every arm x path side by side) and the production student per surface."""

import contextlib
import datetime as dt
import json
import shutil
from pathlib import Path

import dagster as dg
import polars as pl

from gem_model.config import env
from gem_model.store.paths import models_dir, reports_dir
from gem_pipelines import quality_gate
from gem_pipelines.assets.foundation import ASSET as FOUNDATION_ASSET
from gem_pipelines.assets.foundation import GPU_TAGS, rescore, resumed_metadata, run_lineage, run_version
from gem_pipelines.assets.refresh import ASSET as REFRESH_ASSET
from gem_pipelines.assets.refresh import serving_foundation
from gem_pipelines.metadata import (
    distillation_plot,
    distillation_table,
    loss_curve_plot,
    md_table,
    metric_table,
    progress,
    report_metadata,
)
from gem_pipelines.partitions import (
    CALENDAR,
    SURFACES,
    domain_partitions_def,
    role_date_partitions_def,
    surface_partitions_def,
)
from gem_pipelines.report_pages import distillation_page
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource
from gem_pipelines.settings import QUALITY, TRAINING_RETRY

GROUP_FOUNDATION, GROUP_STUDENTS = "foundation", "students"
# Students and domain models refresh when their teacher changes or new data lands, never retraining it.
ON_TEACHER_CHANGE = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
# Every day's predictions, not only the latest, follow a new teacher. A domain model or a day's refresh whose gate
# failed leaves its last ACCEPTED version serving (the refresh: the weekly foundation), so they need not wait for
# their checks.
TEACHER_PREDICTIONS_CONDITION = dg.AutomationCondition.eager().without(
    dg.AutomationCondition.in_latest_time_window()
) & dg.AutomationCondition.all_deps_blocking_checks_passed().ignore(
    dg.AssetSelection.assets("domain_models", REFRESH_ASSET))

# Between date- and domain-partitioned assets every partition reads every partition of the other. Left
# implicit, Dagster 1.13 infers the identity mapping, so teacher_predictions[2026-11-05] "depends on"
# domain_models[2026-11-05], a key the domain side lacks: the backfill daemon then refuses the run
# ("depends on non-existent partitions") and the partition stays green although its inputs changed.
EVERY_PARTITION = dg.AllPartitionMapping()
# A domain model follows its teacher, not each new day of examples (the teacher's cadence decides when
# the window's data is learnt): training_examples is lineage here, not a trigger.
_EXAMPLES = dg.AssetSelection.assets("training_examples")
DOMAIN_MODELS_CONDITION = dg.AutomationCondition.eager().ignore(
    _EXAMPLES
) & dg.AutomationCondition.all_deps_blocking_checks_passed().ignore(_EXAMPLES)
GPU_STEP = {"op_tags": GPU_TAGS, "pool": "gpu"}


def accepted_checkpoint(asset: str, partition: str | None, missing: str) -> tuple[str, str]:
    """(checkpoint file, version) of the ACCEPTED version (downstream reads nothing else); without one, a
    failure that says `missing`."""
    from gem_model.models.registry import read_accepted, resolve_checkpoint

    if (version_dir := read_accepted(asset, partition)) is None:
        raise dg.Failure(missing, allow_retries=False)  # nothing a retry would change
    return str(resolve_checkpoint(version_dir)), version_dir.name


def _accepted_foundation() -> tuple[str, str]:
    return accepted_checkpoint(FOUNDATION_ASSET, None, f"no ACCEPTED {FOUNDATION_ASSET} version: materialize "
                               "foundation_model and pass its quality gate")


def _serving_foundation(day: dt.date) -> tuple[str, str]:
    from gem_model.models.registry import resolve_checkpoint

    if (serving := serving_foundation(day)) is None:
        return _accepted_foundation()  # none ACCEPTED: fails, saying what is missing
    return str(resolve_checkpoint(serving[0])), serving[0].name


def _hierarchical_domains() -> list[str]:
    """Domains of two or more surfaces: only they have a domain model (the hierarchical path)."""
    return [d for d in SURFACES.domains if len(SURFACES.in_domain(d)) >= 2]


def accepted_teachers(day: dt.date | None = None) -> dict[str, tuple[str, str]]:
    """Teacher name ("foundation", "domain:<name>") -> (checkpoint, version) of every ACCEPTED teacher; with `day`,
    the foundation that serves it (its daily refresh, gem_pipelines.assets.refresh)."""
    foundation = _accepted_foundation() if day is None else _serving_foundation(day)
    return {"foundation": foundation} | {
        f"domain:{d}": accepted_checkpoint("domain_models", d, f"no ACCEPTED domain model for {d!r}: materialize "
                                           f"domain_models[{d}]") for d in _hierarchical_domains()}


def teacher_checkpoints(day: dt.date | None = None) -> dict[str, str]:
    """Teacher name -> checkpoint of every ACCEPTED teacher (accepted_teachers without the versions)."""
    return {name: ckpt for name, (ckpt, _) in accepted_teachers(day).items()}


def _accepted_student_pairs() -> dict[str, tuple[str, str]]:
    """Surface -> (arm, path) of its ACCEPTED student, for surfaces that have one."""
    from gem_model.models.registry import read_accepted

    out = {}
    for surface in SURFACES.names:
        found = read_accepted("students", surface)
        if found is not None and (found / "metrics.json").is_file():
            key = json.loads((found / "metrics.json").read_text())["key"]
            out[surface] = (key["arm"], key["path"])
    return out


class StudentsConfig(dg.Config):
    """Launch-time settings of the distillation experiment."""

    preset: str = str(env("GEM_MODEL_PRESET"))  # assets/models/students.yaml preset
    arms: list[str] = ["labels_only", "standard_kd", "parameter_sharing"]
    paths: list[str] = ["direct", "hierarchical"]
    seeds: list[int] = [0]
    # every arm x path every day, not only when a teacher changed (see distillation_report)
    reselect_daily: bool = False


@dg.asset(
    partitions_def=domain_partitions_def,
    group_name=GROUP_FOUNDATION,
    deps=[FOUNDATION_ASSET, dg.AssetDep("training_examples", partition_mapping=EVERY_PARTITION)],
    **GPU_STEP,
    retry_policy=TRAINING_RETRY,  # a retried step resumes its version (run_version)
    automation_condition=DOMAIN_MODELS_CONDITION,
    check_specs=[quality_gate.spec("domain_models", domain_partitions_def)],
)
def domain_models(context: dg.AssetExecutionContext, lake: LakeResource, accelerator: AcceleratorResource,
                  wandb: WandbResource):
    """A domain foundation model: the teacher's weights, distilled from its predictions on the domain's surfaces."""
    from gem_model.distill import predict_teacher, save_domain_model, train_domain_model
    from gem_model.eval.metrics import evaluate_day
    from gem_model.models.registry import load_model
    from gem_model.train.loop import CHECKPOINT
    from gem_model.train.tracking import Tracker

    domain = context.partition_key
    if domain not in _hierarchical_domains():  # nothing trained, nothing ACCEPTED; the gate says why
        note = "not applicable: the domain has one surface"
        yield dg.MaterializeResult(metadata={"status": note, "surfaces": [s.name for s in SURFACES.in_domain(domain)]})
        yield dg.AssetCheckResult(check_name="quality_gate", passed=True, metadata={"status": note})
        return
    wandb.apply()
    ckpt, teacher_version = _accepted_foundation()
    foundation, foundation_config = load_model(ckpt)
    roles = CALENDAR.roles()
    surfaces = [s.name for s in SURFACES.in_domain(domain)]
    # The foundation's targets on this domain, as it serves them (ads born since its window folded in), computed
    # here: teacher_predictions (which also holds this domain model's own pass) is downstream of domain_models,
    # so reading it would be a cycle.
    targets = predict_teacher(foundation, roles.student, "foundation", teacher_version, surfaces=surfaces,
                              uri=lake.table("training_examples"), device=accelerator.resolved_device(),
                              precision=accelerator.train_precision(), recalibrate=True, fold_in=foundation_config,
                              refit_cache=Path(ckpt).parent)
    version, _ = run_version(context, "domain_models", domain)  # a retry or re-execution: its checkpoint
    checkpoint = models_dir("domain_models", domain) / version / CHECKPOINT
    # grouped with its teacher's W&B runs (foundation runs are grouped as foundation-<version>)
    tracker = Tracker(name=f"domain-{domain}", group=f"foundation-{teacher_version}", job_type="domain_model",
                      config={"domain": domain, "teacher_version": teacher_version, "version": version})
    with progress(context.log, f"domain_models[{domain}] training"):
        model, info = train_domain_model(domain, foundation, teacher_predictions=targets, dates=roles.student,
                                         preset=str(env("GEM_MODEL_PRESET")),
                                         uri=lake.table("training_examples"), log=tracker.log,
                                         device=accelerator.resolved_device(),
                                         precision=accelerator.train_precision(), fold_in=foundation_config,
                                         checkpoint=checkpoint)
    path = save_domain_model(model, info, version=version)
    tracker.log_artifact(path, name=f"domain-{domain}", metadata={"version": version})
    run_info = tracker.info()
    tracker.finish()
    day = roles.evaluation.isoformat()
    rows = evaluate_day(model, roles.evaluation, surfaces, uri=lake.table("training_examples"),
                        oracle_uri=lake.table("oracle"))  # on the device the model is on
    previous = quality_gate.accepted_rows("domain_models", day, domain,
                                          rescore=lambda d: rescore(d, surfaces, lake_uri=lake.uri()))
    verdict = quality_gate.gate(rows, previous, QUALITY.model_gate, allow_ungated=True)
    quality_gate.record(path.parent, verdict, rows, day)
    checkpoint.unlink(missing_ok=True)  # judged: never resumed, and model.pt holds the weights
    yield dg.MaterializeResult(
        metadata={
            "version": version,
            "checkpoint": dg.MetadataValue.path(str(path)),
            "teacher_version": teacher_version,
            "surfaces": surfaces,
            "train_days": f"{roles.student[0]}..{roles.student[1]}",
            "steps": int(info.get("steps", 0)),
            **resumed_metadata(info.get("resumed_from_step")),
            "accepted": verdict["passed"],
            "evaluation": metric_table(rows),
            "loss_curve": loss_curve_plot(list(enumerate(info.get("losses", [])))),
            **{f"wandb_{k}": str(v) for k, v in run_info.items() if v},
        }
    )
    yield quality_gate.check_result(verdict, version, day)
    quality_gate.accept("domain_models", version, verdict, domain)  # after the check event: traceable


@dg.asset(
    partitions_def=role_date_partitions_def,
    group_name=GROUP_FOUNDATION,
    deps=[FOUNDATION_ASSET, REFRESH_ASSET, dg.AssetDep("domain_models", partition_mapping=EVERY_PARTITION),
          # the day's rows, and the two days before it that a stale map is re-fitted on (predict_teacher)
          dg.AssetDep("training_examples", partition_mapping=dg.TimeWindowPartitionMapping(
              start_offset=-2, allow_nonexistent_upstream_partitions=True))],
    **GPU_STEP,
    automation_condition=TEACHER_PREDICTIONS_CONDITION,
)
def teacher_predictions(context: dg.AssetExecutionContext, lake: LakeResource, accelerator: AcceleratorResource):
    """One batched pass of every teacher over the day's examples: predictions + summary embeddings."""
    from gem_model.distill import predict_teacher, write_teacher_predictions
    from gem_model.distill.serving_fold_in import fold_window, serve_slices
    from gem_model.models.calibration import refit_days
    from gem_model.models.registry import load_model

    date = dt.date.fromisoformat(context.partition_key)
    teachers = accepted_teachers(date)
    written = []
    for name, (ckpt, version) in teachers.items():
        model, config = load_model(ckpt)
        surfaces = None if name == "foundation" else [s.name for s in SURFACES.in_domain(name.split(":", 1)[1])]
        # every teacher folds in the ids born since its window (a domain model's: its student window; one saved
        # without a window is scored as it is)
        df = predict_teacher(model, [date], name, version, surfaces=surfaces, uri=lake.table("training_examples"),
                             device=accelerator.resolved_device(), precision=accelerator.train_precision(),
                             recalibrate=True, fold_in=config, refit_cache=Path(ckpt).parent)
        fit_day = getattr(getattr(model, "calibrator", None), "fit_day", None)
        folded = fold_window(model, config, date)
        slices = len(serve_slices(model, config))
        written.append({"teacher": name, "version": version, "rows": df.height,
                        "map fitted on": ",".join(map(str, refit_days(date, fit_day) or [])) or fit_day or "no map",
                        "ids folded in from": (" .. ".join(map(str, folded)) if folded else "none")
                        + (f"; the day in {slices} slices, each with its earlier hours" if slices > 1 else ""),
                        "delta_version": write_teacher_predictions(df, uri=lake.table("teacher_predictions"))})
    return dg.MaterializeResult(
        metadata={"rows": sum(w["rows"] for w in written),
                  "teachers": md_table(written, ["teacher", "version", "rows", "map fitted on", "ids folded in from",
                                                 "delta_version"]),
                  "delta_version": max(w["delta_version"] for w in written)}
    )


@dg.asset(
    group_name=GROUP_STUDENTS,
    deps=["teacher_predictions", "domain_models", FOUNDATION_ASSET],
    **GPU_STEP,
    retry_policy=TRAINING_RETRY,  # a retried step continues each student from its checkpoint
    automation_condition=ON_TEACHER_CHANGE,
)
def distillation_report(context: dg.AssetExecutionContext, config: StudentsConfig, lake: LakeResource,
                        wandb: WandbResource, accelerator: AcceleratorResource):
    """Every transfer arm x path x surface on the validation (E-1) and evaluation (E) days, and the (arm, path)
    selected per surface, when a teacher changed (or `reselect_daily`); between teacher changes the selection
    stands and only the labels_only arm trains on the new days (the floor each student's gate reads)."""
    from gem_model.distill import run_distillation, write_report
    from gem_model.distill.arms import BASELINE, arm_paths
    from gem_model.distill.run import REPORT_FILE
    from gem_model.models.registry import run_tag

    wandb.apply()
    # each student's resumable state, kept for this lineage of runs (a retry, a re-execution) until the report is written
    checkpoints = models_dir("distillation_report") / f"checkpoints-{run_tag(run_lineage(context))}"
    accepted = accepted_teachers()
    teachers = {name: ckpt for name, (ckpt, _) in accepted.items()}
    versions = {name: version for name, (_, version) in accepted.items()}
    kept = None if config.reselect_daily else selection_to_keep(versions, config.arms)
    arms = [BASELINE] if kept is not None else config.arms
    context.log.info(f"distillation_report: teachers unchanged since the selection on {kept['selection']['on']}: "
                     "that selection stands, only the labels_only floor trains on the new days" if kept is not None
                     else "distillation_report: every arm x path (the teachers changed, or no earlier selection)")
    total = len(SURFACES.names) * len(config.seeds) * sum(len(arm_paths(a, config.paths)) for a in arms)
    with progress(context.log, "distillation_report", total=total) as p:
        rows = run_distillation(
            arms, config.paths, config.seeds, preset=config.preset, teachers=teachers,
            uri=lake.table("training_examples"), tp_uri=lake.table("teacher_predictions"), oracle_uri=lake.table("oracle"),
            tracking_group=_accepted_foundation()[1],
            device=accelerator.resolved_device(), precision=accelerator.train_precision(), checkpoint_dir=checkpoints,
            on_student=lambda key, _m, _r, info: p.step(
                f"{key['surface']} {key['arm']}/{key['path']} seed {key['seed']} ({int(info.get('steps', 0))} steps)"),
        )
    path = write_report(rows, reports_dir() / REPORT_FILE, incumbents=_accepted_student_pairs(),
                        keep_within=QUALITY.student_selection.keep_accepted_within, teachers=versions,
                        selection_from=kept, preset=config.preset)
    shutil.rmtree(checkpoints, ignore_errors=True)
    with contextlib.suppress(OSError):  # the folder goes too, unless another lineage's run is writing there
        checkpoints.parent.rmdir()
    selected_on = kept["selection"]["on"] if kept is not None else CALENDAR.roles().validation.isoformat()
    return dg.MaterializeResult(
        metadata={**report_metadata("report", distillation_page(path)), "rows": len(rows),
                  "arms": ", ".join(arms), "selection made on": selected_on,
                  "table": distillation_table(rows), "click_ne_by_arm": distillation_plot(rows)}
    )


@dg.asset(
    partitions_def=surface_partitions_def,
    group_name=GROUP_STUDENTS,
    deps=["distillation_report"],
    **GPU_STEP,
    retry_policy=TRAINING_RETRY,  # a retried step resumes its version (run_version)
    automation_condition=ON_TEACHER_CHANGE,
    check_specs=[quality_gate.spec("students", surface_partitions_def, ", and never worse than the labels_only arm "
                                   "of the distillation report by more than max_vs_labels_only")],
)
def students(context: dg.AssetExecutionContext, lake: LakeResource, wandb: WandbResource,
             accelerator: AcceleratorResource):
    """The production student of a surface: the (arm, path) the distillation report selected (lowest click NE
    on E-1, the ACCEPTED student's pair kept within student_selection.keep_accepted_within), exported."""
    from gem_model.distill import score_student, train_production_student
    from gem_model.distill.run import REPORT_FILE
    from gem_model.models.registry import read_accepted

    wandb.apply()
    surface = context.partition_key
    report = json.loads((reports_dir() / REPORT_FILE).read_text())
    arm, path = report["selected"][surface]["arm"], report["selected"][surface]["path"]
    teachers = teacher_checkpoints()
    version, _ = run_version(context, "students", surface)  # a retry or re-execution: its checkpoint
    accepted = read_accepted("students", surface)  # warm start from it when it is the same model
    with progress(context.log, f"students[{surface}] training ({arm}/{path})"):
        # the preset the report's students trained with (the labels_only floor the gate reads among them)
        preset = report.get("preset") or str(env("GEM_MODEL_PRESET"))
        out = train_production_student(surface, arm, path, version=version, teachers=teachers, preset=preset,
                                       uri=lake.table("training_examples"), tp_uri=lake.table("teacher_predictions"),
                                       oracle_uri=lake.table("oracle"), tracking_group=_accepted_foundation()[1],
                                       device=accelerator.resolved_device(),
                                       precision=accelerator.train_precision(), init_from=accepted)
    start = out["train"]["warm_start"]
    context.log.info(f"students[{surface}]: {'warm start from ' + accepted.name if start == 'warm' else start}")
    evaluation = [r for r in out["rows"] if r["split"] == "evaluation"]
    e = CALENDAR.roles().evaluation
    day = e.isoformat()
    previous = quality_gate.accepted_rows("students", day, surface, rescore=lambda d: score_student(
        d, e, uri=lake.table("training_examples"), tp_uri=lake.table("teacher_predictions"), oracle_uri=lake.table("oracle")))
    verdict = quality_gate.gate(evaluation, previous,
                                QUALITY.model_gate, reference=labels_only_rows(report["rows"], surface),
                                allow_ungated=True)
    quality_gate.record(out["model_dir"], verdict, evaluation, day)
    Path(out["checkpoint"]).unlink(missing_ok=True)  # judged: never resumed, and model.pt holds the weights
    yield dg.MaterializeResult(
        metadata={
            "arm": arm, "path": path, "version": version, "preset": preset,
            **resumed_metadata(out["train"].get("resumed_from_step")),
            "selection": ("kept the ACCEPTED student's arm and path" if report["selected"][surface]["kept_accepted"]
                          else f"lowest click NE on E-1 ({report['selection']['on']})"),
            # the ACCEPTED version it started from, or why it started cold
            "warm_start_from": accepted.name if start == "warm" else start,
            "model_dir": dg.MetadataValue.path(out["model_dir"]),
            "export": dg.MetadataValue.path(out["export"]) if out.get("export") else "none",
            "teacher_checkpoint": teachers["foundation"],
            "domain_model": teachers.get(f"domain:{SURFACES.get(surface).domain}", ""),
            "accepted": verdict["passed"],
            "evaluation": metric_table(evaluation),
            "models_dir": dg.MetadataValue.path(str(models_dir("students", surface))),
        }
    )
    yield quality_gate.check_result(verdict, version, day)
    quality_gate.accept("students", version, verdict, surface)  # after the check event: traceable


def selection_to_keep(teachers: dict[str, str], arms: list[str]) -> dict | None:
    """The last report, when its (arm, path) selection still stands: made by comparing the same `arms` with
    the same teacher versions, for every surface. Between teacher changes the arms differ by a new day of data
    only, and re-ranking them daily (about 20 students) would cost a day most of its wall time."""
    from gem_model.distill.run import REPORT_FILE

    report = reports_dir() / REPORT_FILE
    if not report.is_file():
        return None
    doc = json.loads(report.read_text())
    made = doc.get("selection") or {}
    if (made.get("teachers") != teachers or not made.get("on") or set(made.get("arms", [])) != set(arms)
            or set(doc.get("selected", {})) != set(SURFACES.names)):
        return None
    return doc


def labels_only_rows(rows: list[dict], surface: str) -> list[dict]:
    """The labels_only arm on E for one surface, NE averaged over seeds: the floor a student must reach."""
    df = pl.DataFrame(rows, infer_schema_length=None).filter(
        (pl.col("arm") == "labels_only") & (pl.col("split") == "evaluation") & (pl.col("surface") == surface))
    return df.group_by("surface", "task").agg(pl.col("ne").mean(), pl.col("positives").max()).to_dicts()
