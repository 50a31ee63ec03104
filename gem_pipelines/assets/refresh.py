"""The daily refresh of the foundation (gem_model.train.refresh): `foundation_refresh[D]` continues the version that
served D-1 on the day that entered D's teacher window and, once its gate passes, serves D's `teacher_predictions`
alone. Nothing else reads it: domain models, distillation and students keep the weekly ACCEPTED foundation, so a
refresh re-predicts one day instead of retraining the graph below the teacher."""

import datetime as dt
from pathlib import Path

import dagster as dg

from gem_model.train.refresh import REFRESH_ASSET, refresh_partition
from gem_pipelines import quality_gate
from gem_pipelines.assets.foundation import ASSET as FOUNDATION_ASSET
from gem_pipelines.assets.foundation import GPU_TAGS, rescore, resumed_metadata, run_version
from gem_pipelines.metadata import loss_curve_plot, metric_table, progress
from gem_pipelines.partitions import CALENDAR, role_date_partitions_def
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource
from gem_pipelines.settings import QUALITY, TRAINING_RETRY

ASSET = REFRESH_ASSET
# D's refresh trains on days up to D's teacher window end, selects on D-1 and is gated on D.
_TEACHER_END = (CALENDAR.roles().teacher[1] - CALENDAR.roles().evaluation).days
# Only the newest day is refreshed: an older day was served by the version of its own day. A refused or failed
# foundation retrain leaves the ACCEPTED one serving, so the refresh need not wait for its checks.
REFRESH_CONDITION = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed().ignore(
    dg.AssetSelection.assets(FOUNDATION_ASSET))


def serving_foundation(day: dt.date) -> tuple[Path, str] | None:
    """(version dir, the ACCEPTED foundation's version) of the foundation that serves `day`: `day`'s ACCEPTED
    refresh when it continues the ACCEPTED foundation, else the ACCEPTED foundation; None when there is none."""
    from gem_model.models.registry import read_accepted
    from gem_model.train.refresh import read_refresh

    root = read_accepted(FOUNDATION_ASSET)
    if root is None:
        return None
    refreshed = read_accepted(ASSET, refresh_partition(day))
    record = read_refresh(refreshed) if refreshed is not None else None
    return (refreshed if record is not None and record["root"] == root.name else root), root.name


@dg.asset(
    partitions_def=role_date_partitions_def,
    group_name="foundation",
    deps=[FOUNDATION_ASSET, dg.AssetDep("training_examples", partition_mapping=dg.TimeWindowPartitionMapping(
        start_offset=_TEACHER_END, allow_nonexistent_upstream_partitions=True))],
    op_tags=GPU_TAGS,
    pool="gpu",
    retry_policy=TRAINING_RETRY,  # a retried step resumes its version (run_version)
    automation_condition=REFRESH_CONDITION,
    check_specs=[quality_gate.spec(ASSET, role_date_partitions_def, "; the version it replaces is the one that "
                                   "served the day before")],
)
def foundation_refresh(context: dg.AssetExecutionContext, lake: LakeResource, accelerator: AcceleratorResource,
                       wandb: WandbResource):
    """The foundation that serves day D: the one that served D-1, continued on the days that entered D's teacher
    window since its own (none new: it serves D as it is, nothing trained)."""
    from gem_model.train.refresh import days_to_refresh, refresh_epochs, refresh_foundation, version_config

    day = dt.date.fromisoformat(context.partition_key)
    if (serving := serving_foundation(day - dt.timedelta(days=1))) is None:
        raise dg.Failure(f"no ACCEPTED {FOUNDATION_ASSET} version: materialize foundation_model and pass its gate",
                         allow_retries=False)  # nothing a retry would change
    init, root_name = serving
    preset = version_config(init)["preset"]
    epochs = refresh_epochs(preset)
    todo = days_to_refresh(init, day) if epochs else None
    if todo is None:
        note = (f"serves {day} as it is: {init.name} trained through its teacher window" if epochs else
                f"off: train.refresh_epochs is unset in preset {preset!r}")
        yield dg.MaterializeResult(metadata={"status": note, "serving": init.name})
        yield dg.AssetCheckResult(check_name=quality_gate.CHECK, passed=True, metadata={"status": "nothing trained: " + note})
        return
    wandb.apply()
    version, resume = run_version(context, ASSET, refresh_partition(day))
    with progress(context.log, f"foundation_refresh[{day}] on {todo[0]}..{todo[1]} from {init.name}"):
        result = refresh_foundation(init, day, todo, root=root_name, epochs=epochs, partition=refresh_partition(day),
                                    asset=ASSET, version=version, resume=resume, device=accelerator.resolved_device(),
                                    lake=lake.uri(), overrides={"train": accelerator.train_overrides()})
    rows = [r for r in result["rows"] if r["model"] == "foundation"]
    verdict = quality_gate.gate(rows, rescore(init, lake_uri=lake.uri(), day=day), QUALITY.model_gate)
    quality_gate.record(result["version_dir"], verdict, rows, day.isoformat())
    yield dg.MaterializeResult(metadata={
        "version": version, "continues": init.name, "root": root_name, "trained_on": f"{todo[0]}..{todo[1]}",
        "best_step": int(result["best_step"]), "accepted": verdict["passed"], "per_surface": metric_table(rows),
        **resumed_metadata(result.get("resumed_from_step")),
        "loss_curve": loss_curve_plot(result["loss_curve"]),
        **{f"wandb_{k}": str(v) for k, v in (result.get("wandb") or {}).items() if v}})
    yield quality_gate.check_result(verdict, version, day.isoformat())
    quality_gate.accept(ASSET, version, verdict, refresh_partition(day))  # after the check event: traceable

