"""Post-training: domain foundation models, the shared teacher-predictions cache, the distillation
report (every arm x path side by side) and the production student per surface."""

import datetime as dt
import json
import os

import dagster as dg

from gem_model.paths import models_dir, reports_dir
from gem_pipelines.assets.foundation import ASSET as FOUNDATION_ASSET
from gem_pipelines.assets.foundation import GPU_TAGS
from gem_pipelines.metadata import distillation_plot, distillation_table
from gem_pipelines.partitions import (
    CALENDAR,
    SURFACES,
    date_partitions_def,
    domain_partitions_def,
    surface_partitions_def,
)
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource

GROUP_FOUNDATION, GROUP_STUDENTS = "foundation", "students"
# Students and domain models refresh when their teacher changes or new data lands, never retraining it.
ON_TEACHER_CHANGE = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()


def version_for(context: dg.AssetExecutionContext) -> str:
    """<UTC time>-<run id prefix>, as DESIGN.md §2 names model versions."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{context.run_id[:6]}"


def accepted_checkpoint(asset: str, partition: str | None = None) -> tuple[str, str] | None:
    """(checkpoint file, version) of the ACCEPTED version: downstream reads nothing else."""
    from gem_model.registry import read_accepted, resolve_checkpoint

    version_dir = read_accepted(asset, partition)
    return None if version_dir is None else (str(resolve_checkpoint(version_dir)), version_dir.name)


def _accepted_foundation() -> tuple[str, str]:
    found = accepted_checkpoint(FOUNDATION_ASSET)
    if found is None:
        raise dg.Failure(f"no ACCEPTED {FOUNDATION_ASSET} version: materialize foundation_model and pass its quality gate")
    return found


def _hierarchical_domains() -> list[str]:
    """Domains of two or more surfaces: only they have a domain model (the hierarchical path)."""
    return [d for d in SURFACES.domains if len(SURFACES.in_domain(d)) >= 2]


def _accepted_domains() -> dict[str, tuple[str, str]]:
    out = {}
    for domain in _hierarchical_domains():
        found = accepted_checkpoint("domain_models", domain)
        if found is None:
            raise dg.Failure(f"no ACCEPTED domain model for {domain!r}: materialize domain_models[{domain}]")
        out[domain] = found
    return out


def _accepted_teachers() -> dict[str, tuple[str, str]]:
    """Teacher name ("foundation", "domain:<name>") -> (checkpoint, version) of every ACCEPTED teacher."""
    return {"foundation": _accepted_foundation()} | {f"domain:{d}": found for d, found in _accepted_domains().items()}


def _tp_uri(lake: LakeResource) -> str:
    return lake.table("teacher_predictions")


class StudentsConfig(dg.Config):
    """Launch-time settings of the distillation experiment."""

    preset: str = os.environ.get("GEM_MODEL_PRESET", "small")  # assets/models/students.yaml preset
    arms: list[str] = ["labels_only", "standard_kd", "parameter_sharing"]
    paths: list[str] = ["direct", "hierarchical"]
    seeds: list[int] = [0]


@dg.asset(
    partitions_def=domain_partitions_def,
    group_name=GROUP_FOUNDATION,
    deps=[FOUNDATION_ASSET, "training_examples"],
    op_tags=GPU_TAGS,
    pool="gpu",
    automation_condition=ON_TEACHER_CHANGE,
)
def domain_models(context: dg.AssetExecutionContext, lake: LakeResource, accelerator: AcceleratorResource,
                  wandb: WandbResource):
    """A domain foundation model: the teacher's weights, distilled from its predictions on the domain's surfaces."""
    from gem_model.distill import predict_teacher, save_domain_model, train_domain_model
    from gem_model.registry import load_model, write_accepted
    from gem_model.tracking import Tracker

    domain = context.partition_key
    if domain not in _hierarchical_domains():
        return dg.MaterializeResult(metadata={"status": "not applicable: the domain has one surface",
                                              "surfaces": [s.name for s in SURFACES.in_domain(domain)]})
    wandb.apply()
    ckpt, teacher_version = _accepted_foundation()
    foundation, _ = load_model(ckpt)
    roles = CALENDAR.roles()
    surfaces = [s.name for s in SURFACES.in_domain(domain)]
    # The foundation's targets on this domain, computed here: teacher_predictions (which also holds
    # this domain model's own pass) is downstream of domain_models, so reading it would be a cycle.
    targets = predict_teacher(foundation, roles.student, "foundation", teacher_version, surfaces=surfaces,
                              uri=lake.table("training_examples"), device=accelerator.resolved_device())
    version = version_for(context)
    # grouped with its teacher's W&B runs (foundation runs are grouped as foundation-<version>)
    tracker = Tracker(name=f"domain-{domain}", group=f"foundation-{teacher_version}", job_type="domain_model",
                      config={"domain": domain, "teacher_version": teacher_version, "version": version})
    model, info = train_domain_model(domain, foundation, teacher_predictions=targets, dates=roles.student,
                                     preset=os.environ.get("GEM_MODEL_PRESET", "small"),
                                     uri=lake.table("training_examples"), log=tracker.log)
    path = save_domain_model(model, info, version=version)
    tracker.log_artifact(path, name=f"domain-{domain}", metadata={"version": version})
    run_info = tracker.info()
    tracker.finish()
    write_accepted("domain_models", version, domain)
    return dg.MaterializeResult(
        metadata={
            "version": version,
            "checkpoint": dg.MetadataValue.path(str(path)),
            "teacher_version": teacher_version,
            "surfaces": surfaces,
            "train_days": f"{roles.student[0]}..{roles.student[1]}",
            "steps": int(info.get("steps", 0)),
            **{f"wandb_{k}": str(v) for k, v in run_info.items() if v},
        }
    )


@dg.asset(
    partitions_def=date_partitions_def,
    group_name=GROUP_FOUNDATION,
    deps=[FOUNDATION_ASSET, "domain_models", dg.AssetDep("training_examples")],
    op_tags=GPU_TAGS,
    pool="gpu",
    automation_condition=ON_TEACHER_CHANGE,
)
def teacher_predictions(context: dg.AssetExecutionContext, lake: LakeResource, accelerator: AcceleratorResource):
    """One batched pass of every teacher over the day's examples: predictions + summary embeddings."""
    from gem_model.distill import predict_teacher, write_teacher_predictions
    from gem_model.registry import load_model

    date = dt.date.fromisoformat(context.partition_key)
    teachers = _accepted_teachers()
    rows, versions, delta_version = {}, {}, None
    for name, (ckpt, version) in teachers.items():
        model, _ = load_model(ckpt)
        surfaces = None if name == "foundation" else [s.name for s in SURFACES.in_domain(name.split(":", 1)[1])]
        df = predict_teacher(model, [date], name, version, surfaces=surfaces, uri=lake.table("training_examples"),
                             device=accelerator.resolved_device())
        delta_version = write_teacher_predictions(df, uri=_tp_uri(lake))
        rows[name], versions[name] = df.height, version
    return dg.MaterializeResult(
        metadata={"rows": sum(rows.values()), "rows_by_teacher": dg.MetadataValue.json(rows),
                  "teacher_versions": dg.MetadataValue.json(versions), "delta_version": delta_version or -1}
    )


@dg.asset(
    group_name=GROUP_STUDENTS,
    deps=["teacher_predictions", "domain_models", FOUNDATION_ASSET],
    op_tags=GPU_TAGS,
    pool="gpu",
    automation_condition=ON_TEACHER_CHANGE,
)
def distillation_report(context: dg.AssetExecutionContext, config: StudentsConfig, lake: LakeResource,
                        wandb: WandbResource):
    """Every transfer arm x path x surface on the validation (E-1) and evaluation (E) days."""
    from gem_model.distill import run_distillation, write_report

    wandb.apply()
    teachers = {name: ckpt for name, (ckpt, _) in _accepted_teachers().items()}
    rows = run_distillation(config.arms, config.paths, config.seeds, preset=config.preset, teachers=teachers,
                            uri=lake.table("training_examples"), tp_uri=_tp_uri(lake),
                            oracle_uri=lake.table("oracle"), tracking_group=_accepted_foundation()[1])
    path = write_report(rows, reports_dir() / "distillation_report.json")
    return dg.MaterializeResult(
        metadata={"report": dg.MetadataValue.path(str(path)), "rows": len(rows),
                  "table": distillation_table(rows), "click_ne_by_arm": distillation_plot(rows)}
    )


@dg.asset(
    partitions_def=surface_partitions_def,
    group_name=GROUP_STUDENTS,
    deps=["distillation_report"],
    op_tags=GPU_TAGS,
    pool="gpu",
    automation_condition=ON_TEACHER_CHANGE,
)
def students(context: dg.AssetExecutionContext, lake: LakeResource, wandb: WandbResource):
    """The production student of a surface: the (arm, path) with the lowest click NE on E-1, exported."""
    from gem_model.distill import select_student, train_production_student
    from gem_model.registry import write_accepted

    wandb.apply()
    surface = context.partition_key
    report = json.loads((reports_dir() / "distillation_report.json").read_text())
    arm, path = select_student(report["rows"], surface)
    teachers = {name: ckpt for name, (ckpt, _) in _accepted_teachers().items()}
    version = version_for(context)
    out = train_production_student(surface, arm, path, version=version, teachers=teachers,
                                   uri=lake.table("training_examples"), tp_uri=_tp_uri(lake),
                                   oracle_uri=lake.table("oracle"), tracking_group=_accepted_foundation()[1])
    write_accepted("students", version, surface)
    evaluation = [r for r in out["rows"] if r["split"] == "evaluation"]
    return dg.MaterializeResult(
        metadata={
            "arm": arm, "path": path, "version": version,
            "model_dir": dg.MetadataValue.path(out["model_dir"]),
            "export": dg.MetadataValue.path(out["export"]) if out.get("export") else "none",
            "teacher_checkpoint": teachers["foundation"],
            "domain_model": teachers.get(f"domain:{SURFACES.get(surface).domain}", ""),
            "evaluation": dg.MetadataValue.json(evaluation),
            "models_dir": dg.MetadataValue.path(str(models_dir("students", surface))),
        }
    )
