"""Foundation group: the GEM teacher (plus single-surface baselines), gated before it is ACCEPTED."""

import json
import os
import sys
from pathlib import Path

import dagster as dg

from gem_model.paths import models_dir, reports_dir
from gem_pipelines import quality_gate
from gem_pipelines.metadata import loss_curve_plot, metric_table, progress
from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource
from gem_pipelines.settings import QUALITY

ASSET = "foundation_model"
# Under the Kubernetes executor each training step gets a GPU; everywhere, one training per GPU.
GPU_TAGS = {
    "dagster-k8s/config": {
        "container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}
    }
}


class FoundationConfig(dg.Config):
    """Launch-time settings of a foundation training run."""

    preset: str = os.environ.get("GEM_MODEL_PRESET", "small")  # assets/models/<preset>.yaml
    seeds: list[int] = [0]
    baselines: bool = True  # also train the single-surface baselines on the same window
    warm_start: bool = True  # start from the last ACCEPTED checkpoint when there is one


def rescore(version_dir: Path, surfaces: list[str] | None = None, lake_uri: str | None = None) -> list[dict]:
    """Metric rows of a GEM version (foundation or domain model) on today's E: what a new version is
    compared with when the accepted one was gated on an earlier E."""
    from gem_model.config import load_calendar, load_surfaces
    from gem_model.metrics import evaluate_day
    from gem_model.paths import table_uri
    from gem_model.registry import load_model

    model, _ = load_model(version_dir)
    return evaluate_day(model, load_calendar().roles().evaluation, surfaces or list(load_surfaces().names),
                        uri=table_uri("training_examples", lake_uri), oracle_uri=table_uri("oracle", lake_uri))


def _run_torchrun(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient, nproc: int, preset: str,
                  device: str, lake_uri: str, init_from: Path | None) -> dict:
    """World size > 1: the teacher alone, through `torchrun -m gem_model.train` launched by Dagster Pipes;
    rank 0 writes the version directory and metrics.json, which is how the results come back."""
    from gem_model.config import load_calendar
    from gem_model.registry import new_version

    roles = load_calendar().roles()
    version = new_version(context.run_id)
    out_dir = models_dir(ASSET) / version
    cfg = {
        "preset": preset, "device": device, "out_dir": str(out_dir),
        "data": {"train": [roles.teacher[0].isoformat(), roles.teacher[1].isoformat()],
                 "valid": roles.validation.isoformat(), "eval": roles.evaluation.isoformat(), "lake": lake_uri},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    launch = out_dir / "launch.json"
    launch.write_text(json.dumps(cfg, indent=2))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "gem_model.train",
           "--config", str(launch)] + (["--init-from", str(init_from)] if init_from else [])
    pipes.run(command=cmd, context=context)
    summary = json.loads((out_dir / "metrics.json").read_text())
    rows = [{"model": "foundation", "seed": 0, **r} for r in summary["rows"]]
    return {"version": version, "checkpoint": summary["checkpoint"], "rows": rows,
            "loss_curve": summary["loss_curve"], "samples_per_s": summary["samples_per_s"],
            "wandb": summary.get("wandb")}


@dg.asset(
    group_name="foundation",
    deps=["training_examples", "oracle"],
    op_tags=GPU_TAGS,
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(
            "quality_gate",
            asset=ASSET,
            blocking=True,
            description="on day E, every (surface, task) with enough positives: NE below the base rate and no "
            "regression beyond max_regression against the last ACCEPTED version (assets/quality.yaml); "
            "only a passing gate writes ACCEPTED",
        )
    ],
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
    from gem_model.foundation import run_foundation, write_eval_report
    from gem_model.registry import read_accepted

    wandb.apply()
    init_from = read_accepted(ASSET) if config.warm_start else None
    if init_from is not None:
        context.log.info(f"warm start from the ACCEPTED version {init_from.name}")
    device = accelerator.resolved_device()
    with progress(context.log, "foundation_model training"):
        if accelerator.nproc_per_node > 1:
            result = _run_torchrun(context, pipes, accelerator.nproc_per_node, config.preset, device, lake.uri(),
                                   init_from)
        else:
            result = run_foundation(config.preset, seeds=tuple(config.seeds), baselines=config.baselines,
                                    device=device, init_from=init_from, lake=lake.uri(),
                                    overrides={"train": accelerator.train_overrides()})
    rows = result["rows"]
    report = write_eval_report(rows, reports_dir() / "foundation_eval.json")
    first_seed = config.seeds[0]
    teacher_rows = [r for r in rows if r["model"] == "foundation" and r["seed"] == first_seed]
    day = load_calendar().roles().evaluation.isoformat()
    previous = quality_gate.accepted_rows(ASSET, day, rescore=lambda d: rescore(d, lake_uri=lake.uri()))
    verdict = quality_gate.gate(teacher_rows, previous, QUALITY.model_gate)
    quality_gate.record(models_dir(ASSET) / result["version"], verdict, teacher_rows, day)
    yield dg.MaterializeResult(
        metadata={
            "version": result["version"],
            "checkpoint": dg.MetadataValue.path(str(result["checkpoint"])),
            "accepted": verdict["passed"],
            "warm_started_from": init_from.name if init_from else "none",
            "per_surface": metric_table(rows),
            "samples_per_s": float(result["samples_per_s"]),
            "report": dg.MetadataValue.path(str(report)),
            "loss_curve": loss_curve_plot(result["loss_curve"]),
            "models_dir": dg.MetadataValue.path(str(models_dir(ASSET))),
            **{f"wandb_{k}": str(v) for k, v in (result.get("wandb") or {}).items() if v},
        }
    )
    yield quality_gate.check_result(verdict, result["version"], day)
    quality_gate.accept(ASSET, result["version"], verdict)  # after the check event: ACCEPTED traces to it
