"""The foundation model and its single-surface baselines, trained on the calendar's teacher window.

`run_foundation` (what the `foundation_model` asset calls) trains the GEM teacher on every surface (selection
on E-1, metrics on E), then the same architecture on one surface at a time, reading only that surface's data
(gem_model.data.own_surface), into $GEM_HOME/models/foundation_model/<version>/ and
$GEM_HOME/models/single_surface_baseline/<surface>/<version>/ (extra seeds under <version>/seed<k>/). It never
writes ACCEPTED: the quality gate does. The asset calls it in process, or launches
`torchrun ... -m gem_model.train.foundation --args args.json` whose every rank calls it with the same
arguments (`main`); rank 0 alone tracks, writes and reports (gem_model.train.distributed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gem_model.config import (
    CalendarConfig,
    FeaturesConfig,
    SurfacesConfig,
    load_calendar,
    load_features,
    load_surfaces,
)
from gem_model.models.registry import new_version, version_dir
from gem_model.store import atomic
from gem_model.store.paths import gem_home, models_dir
from gem_model.train.distributed import (
    ProgressFn,
    broadcast_from_rank0,
    destroy_process_group,
    init_process_group,
    pipes_progress,
    pipes_reporter,
    world,
)
from gem_model.train.loop import METRICS, train
from gem_model.train.tracking import Tracker

FOUNDATION_ASSET = "foundation_model"
BASELINE_ASSET = "single_surface_baseline"
ROW_KEYS = ("surface", "task", "ne", "auc", "calibration", "calibration_raw", "ne_raw", "oracle_ne", "gap", "n",
            "positives")


def run_foundation(
    preset: str,
    *,
    seeds: Sequence[int] = (0,),
    calendar: CalendarConfig | None = None,
    surfaces: SurfacesConfig | None = None,
    features: FeaturesConfig | None = None,
    out_root: str | Path | None = None,
    init_from: str | Path | None = None,
    baselines: bool = True,
    device: str = "auto",
    overrides: dict[str, Any] | None = None,
    lake: str | None = None,
    project: str = "gem",
    version: str | None = None,
    progress: ProgressFn | None = None,
    train_days: tuple[str, str] | None = None,
    asset: str = FOUNDATION_ASSET,
    partition: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train the teacher (+ baselines) for every seed; returns version, checkpoint, rows, curves, W&B info.

    overrides: {"model": {...}, "train": {...}} on top of the preset (e.g. {"train": {"epochs": 2}}).
    out_root: the GEM_HOME whose models/ receives the versions (default: $GEM_HOME).
    init_from: warm-start the teacher from this checkpoint (e.g. the ACCEPTED version's dir).
    version: the version name (default: a new one; under torchrun rank 0's, so every rank agrees).
    progress: told every tracker log call (rank 0), e.g. the Dagster Pipes reporter of a launched run.
    train_days: (first, last) ISO days to train on instead of the teacher window (a daily refresh: the
        days that entered the window since init_from's); validation and evaluation days are unchanged.
    asset, partition: where the teacher's version is written (models/<asset>/[<partition>/]<version>; a daily
        refresh: foundation_refresh/<day>).
    resume: `version` is an interrupted call's: each model it finished (its metrics.json written) is kept as it
        is, the one it was training continues from its last checkpoint, the others train.
    """
    calendar = calendar or load_calendar()
    surfaces = surfaces or load_surfaces()
    features = features or load_features()
    home = Path(out_root) if out_root is not None else gem_home()
    roles = calendar.roles()
    overrides = overrides or {}
    window = list(train_days) if train_days else [roles.teacher[0].isoformat(), roles.teacher[1].isoformat()]
    data = {"train": window, "valid": roles.validation.isoformat(),
            "eval": roles.evaluation.isoformat(), "lake": lake}

    # One short id names the version and prefixes every W&B run id of this call.
    version = broadcast_from_rank0(version or new_version())
    rank0 = world()[0] == 0
    short = version.rsplit("-", 1)[1]
    group = f"foundation-{version}"
    vdir = version_dir(asset, version, partition, home=home)  # validates the name (it may come from a launch file)
    rows: list[dict[str, Any]] = []

    def fit(seed: int, surface: str | None, out_dir: Path, init: str | Path | None) -> dict[str, Any]:
        """The teacher (surface None) or one surface's baseline; rank 0 alone tracks (train() leaves the others
        silent)."""
        name, job = (f"foundation-s{seed}", "foundation") if surface is None else (f"single-{surface}-s{seed}", "single_surface")
        if resume and (done := out_dir / METRICS).is_file():  # written last: this model finished
            summary = json.loads(done.read_text())
        else:
            meta = {"preset": preset, "seed": seed, **({"surface": surface} if surface else {}), "data": data,
                    "version": version}
            run = Tracker(project=project, name=name, group=group, job_type=job, run_id=f"{short}-{name}".replace("_", "-"),
                          config=meta, on_log=progress) if rank0 else None
            config = {"preset": preset, "model": dict(overrides.get("model") or {}), "train": dict(overrides.get("train") or {}),
                      # a baseline reads its surface alone: what the foundation adds is then what other surfaces teach
                      "data": {**data, "surfaces": None if surface is None else [surface], "own_surface": surface is not None},
                      "seed": seed, "device": device,
                      "tracking": {"project": project, "group": group, "name": name, "job_type": job}}
            summary = train(config, out_dir=out_dir, init_from=init, tracker=run, features=features, surfaces=surfaces,
                            resume=resume)
            if run is not None:
                run.finish()
        rows.extend({"model": job, "seed": seed, **{k: r.get(k) for k in ROW_KEYS}} for r in summary["rows"])
        return summary

    result: dict[str, Any] = {}
    baseline_out: dict[str, dict[str, Any]] = {}
    for i, seed in enumerate(seeds):
        first = i == 0
        summary = fit(seed, None, vdir if first else vdir / f"seed{seed}", init_from)
        if first:
            result = {"version": version, "version_dir": str(vdir), **{k: summary[k] for k in (
                "checkpoint", "loss_curve", "valid_history", "samples_per_s", "train_seconds", "param_counts",
                "best_step", "calibration", "wandb", "resumed_from_step")}}  # calibration: the post-hoc map fitted on E-1
        if baselines:
            for s in surfaces.names:
                bdir = models_dir(BASELINE_ASSET, s, home=home) / version
                b_sum = fit(seed, s, bdir if first else bdir / f"seed{seed}", None)
                if first:
                    baseline_out[s] = {"checkpoint": b_sum["checkpoint"], "version_dir": str(bdir),
                                       "samples_per_s": b_sum["samples_per_s"], "wandb": b_sum["wandb"]}
    result.update(rows=rows, baselines=baseline_out, seeds=list(seeds))
    if rank0:
        write_eval_report(rows, Path(result["version_dir"]) / "eval_rows.json")
    return result


def write_eval_report(rows: list[dict[str, Any]], path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """{"rows": [...], **extra} written atomically (e.g. reports/foundation_eval.json)."""
    return atomic.write_json(path, {"rows": rows, **(extra or {})})


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: every rank runs `run_foundation(**args)`; rank 0 reports through Dagster Pipes."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--args", required=True, help="JSON file with run_foundation's keyword arguments")
    args = json.loads(Path(p.parse_args(argv).args).read_text())
    own_pg = init_process_group(args.get("device", "auto"))
    with pipes_reporter() as pipes:  # a failure propagates: torchrun then stops the other ranks
        result = run_foundation(**args, progress=None if pipes is None else pipes_progress(pipes))
        if pipes is not None:
            pipes.report_custom_message({"kind": "result", **result, "world_size": world()[1]})
    if own_pg:
        destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
