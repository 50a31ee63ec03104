"""Foundation group: the GEM teacher (plus single-surface baselines), gated before it is ACCEPTED."""

import datetime as dt
from pathlib import Path

import dagster as dg

from gem_model.config import env
from gem_model.store.paths import models_dir, reports_dir
from gem_pipelines import quality_gate
from gem_pipelines.k8s import GPU_POOL, gpu_step_tags, training_gpus
from gem_pipelines.metadata import (
    calibrator_table,
    loss_curve_plot,
    metric_table,
    progress,
    report_metadata,
    seeds_table,
)
from gem_pipelines.report_pages import foundation_page
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource
from gem_pipelines.settings import QUALITY, TRAINING_RETRY

ASSET = "foundation_model"
# Under the Kubernetes executor each training step gets its GPUs on the GPU node pool (assets/kubernetes.yaml);
# everywhere, the `gpu` pool allows one training step per GPU.
GPU_TAGS = gpu_step_tags()


class FoundationConfig(dg.Config):
    """Launch-time settings of a foundation training run."""

    preset: str = str(env("GEM_MODEL_PRESET"))  # assets/models/<preset>.yaml
    seeds: list[int] = [0]
    baselines: bool = True  # also train the single-surface baselines on the same window
    warm_start: bool = True  # start from the last ACCEPTED checkpoint when there is one


def rescore(version_dir: Path, surfaces: list[str] | None = None, lake_uri: str | None = None,
            day: dt.date | None = None) -> list[dict]:
    """Metric rows of a GEM version (foundation or domain model) on `day` (default today's E): what a new version
    is compared with when the accepted one was gated on an earlier E."""
    from gem_model.config import load_calendar, load_surfaces
    from gem_model.eval.metrics import evaluate_day
    from gem_model.models.registry import load_model
    from gem_model.store.paths import table_uri

    model, _ = load_model(version_dir)
    return evaluate_day(model, day or load_calendar().roles().evaluation, surfaces or list(load_surfaces().names),
                        uri=table_uri("training_examples", lake_uri), oracle_uri=table_uri("oracle", lake_uri))


def run_lineage(context: dg.AssetExecutionContext) -> str:
    """The id of the first run of this run's lineage: its step retries and re-executions share it."""
    return context.run.root_run_id or context.run_id


def run_version(context: dg.AssetExecutionContext, asset: str = ASSET, partition: str | None = None) -> tuple[str, bool]:
    """(version, resume) of a training run. A retry of the step (assets/retries.yaml) or a re-execution of a run
    that died before its gate ("Re-execute" in the UI) continues the version its lineage was writing: its finished
    models kept, the interrupted one from its last checkpoint. Any other run trains a new version. Every version of
    a lineage of runs carries the tag of its first run's id."""
    from gem_model.models.registry import list_versions, new_version, run_tag

    lineage = run_lineage(context)
    if lineage != context.run_id or context.retry_number > 0:
        tag = f"-{run_tag(lineage)}"
        unjudged = [v for v in list_versions(asset, partition)
                    if v.endswith(tag) and not (models_dir(asset, partition) / v / quality_gate.GATE_FILE).exists()]
        if unjudged:
            context.log.info(f"resuming {unjudged[-1]}, left unjudged by run {lineage} of this lineage "
                             f"(attempt {context.retry_number + 1} of this step)")
            return unjudged[-1], True
    return new_version(lineage), False


def resumed_metadata(step: int | None) -> dict[str, int]:
    """{"resumed_from_step": step} when the training continued an interrupted run's checkpoint (the UI shows it)."""
    return {} if step is None else {"resumed_from_step": int(step)}


def launch_args(config: FoundationConfig, accelerator: AcceleratorResource, lake_uri: str | None,
                init_from: Path | None, version: str, resume: bool = False) -> dict:
    """`run_foundation`'s keyword arguments: the same for the in-process and the torchrun launcher."""
    return {"preset": config.preset, "seeds": list(config.seeds), "baselines": config.baselines,
            "device": accelerator.resolved_device(), "init_from": str(init_from) if init_from else None,
            "lake": lake_uri, "overrides": {"train": accelerator.train_overrides()}, "version": version,
            "resume": resume}


def _run_torchrun(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient, nproc: int, args: dict) -> dict:
    """World size > 1: `torchrun -m gem_model.train.foundation` launched by Dagster Pipes; every rank runs
    `run_foundation(**args)`, rank 0 streams progress as Pipes log lines and sends the result as a message."""
    from gem_model.models.registry import version_dir
    from gem_model.store import atomic
    from gem_model.train.distributed import pipes_result, progress_messages, torchrun_command

    launch = atomic.write_json(version_dir(ASSET, args["version"]) / "launch.json", args)  # beside its version
    invocation = pipes.run(command=torchrun_command("gem_model.train.foundation", nproc, ["--args", str(launch)]),
                           context=context)
    messages = invocation.get_custom_messages()
    result = pipes_result(messages)
    result["progress_messages"] = len(progress_messages(messages))
    return result


@dg.asset(
    group_name="foundation",
    deps=["training_examples", "oracle"],
    op_tags=gpu_step_tags(training_gpus()),  # the teacher's torchrun world: GEM_NPROC GPUs of one node
    pool=GPU_POOL,
    retry_policy=TRAINING_RETRY,  # a retried step resumes its version (run_version)
    check_specs=[quality_gate.spec(ASSET)],
    automation_condition=dg.AutomationCondition.on_cron("0 4 * * 1") & dg.AutomationCondition.all_deps_blocking_checks_passed(),
)
def foundation_model(
    context: dg.AssetExecutionContext,
    config: FoundationConfig,
    lake: LakeResource,
    accelerator: AcceleratorResource,
    wandb: WandbResource,
    pipes: dg.PipesSubprocessClient,
):
    """Train the GEM teacher on the calendar's teacher window, evaluate on E against the oracle floor."""
    from gem_model.config import load_calendar
    from gem_model.eval.ad_age import version_report
    from gem_model.models.registry import read_accepted
    from gem_model.train.foundation import run_foundation, write_eval_report

    wandb.apply()
    init_from = read_accepted(ASSET) if config.warm_start else None
    if init_from is not None:
        context.log.info(f"warm start from the ACCEPTED version {init_from.name}")
    args = launch_args(config, accelerator, lake.uri(), init_from, *run_version(context))
    nproc = accelerator.nproc_per_node
    with progress(context.log, "foundation_model training"):
        result = _run_torchrun(context, pipes, nproc, args) if nproc > 1 else run_foundation(**args)
    rows = result["rows"]
    e_day = load_calendar().roles().evaluation  # E's NE by the ad's age, from events alone (issue 24)
    report = write_eval_report(rows, reports_dir() / "foundation_eval.json",
                               extra=version_report(result["version_dir"], e_day, lake.uri()))
    teacher_rows = [r for r in rows if r["model"] == "foundation" and r["seed"] == config.seeds[0]]
    day = e_day.isoformat()
    previous = quality_gate.accepted_rows(ASSET, day, rescore=lambda d: rescore(d, lake_uri=lake.uri()))
    verdict = quality_gate.gate(teacher_rows, previous, QUALITY.model_gate)
    quality_gate.record(models_dir(ASSET) / result["version"], verdict, teacher_rows, day)
    yield dg.MaterializeResult(
        metadata={
            "version": result["version"],
            "checkpoint": dg.MetadataValue.path(str(result["checkpoint"])),
            "accepted": verdict["passed"],
            "warm_started_from": init_from.name if init_from else "none",
            **resumed_metadata(result.get("resumed_from_step")),
            "world_size": nproc,
            "seeds": seeds_table(rows),  # the click NE of each seed: how far seeds differ
            **({"pipes_progress_messages": result["progress_messages"]} if "progress_messages" in result else {}),
            "per_surface": metric_table(rows),  # calibration after the E-1 calibrator, calibration_raw before
            "calibrator": calibrator_table(result.get("calibration")),
            "samples_per_s": float(result["samples_per_s"]),
            # a link the UI opens (an HTML page of the JSON report), and the path relative to GEM_HOME
            **report_metadata("report", foundation_page(report, result["loss_curve"], result.get("calibration"))),
            "loss_curve": loss_curve_plot(result["loss_curve"]),
            "models_dir": dg.MetadataValue.path(str(models_dir(ASSET))),
            **{f"wandb_{k}": str(v) for k, v in (result.get("wandb") or {}).items() if v},
        }
    )
    yield quality_gate.check_result(verdict, result["version"], day)
    quality_gate.accept(ASSET, result["version"], verdict)  # after the check event: ACCEPTED traces to it
