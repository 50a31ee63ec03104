"""`make eval`: the published protocol. 3 seeds of the foundation model, its single-surface baselines,
the base rate and a logistic regression on hand-built features, all on the same rows of E, and every
distillation arm x path with 3 seeds. Selection and early stopping use E-1 only; E is never tuned on.

World: with the simulator, the evaluation world of assets/simulator_eval.yaml (every surface >= 300 click
positives on E), built once into $GEM_HOME/eval_world/ through the Dagster jobs `make demo` runs; its first
seed is the pipeline's own foundation_model run, which, once ACCEPTED, also teaches the domain models and
the distillation arms. `--world demo` (and any GEM_DATA dataset) uses the lake `make demo` built.

Writes reports/foundation_eval_3seeds.json, reports/model_quality.md (the README's table, see
gem_model.eval.model_quality), reports/distillation_report_3seeds.json and reports/distillation_kd_gains.md
(KD gains over labels_only on E with paired bootstrap intervals), and prints its runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from gem_model.config import SIM, dataset_name
from gem_model.config import env as env_value
from gem_model.distill.arms import ARMS
from gem_model.eval.model_quality import model_quality, quality_markdown, run_lr_baselines
from gem_model.models.registry import list_versions, version_dir
from gem_model.store.atomic import write_json, write_text
from gem_model.store.paths import gem_home, reports_dir

FOUNDATION_ASSET = "foundation_model"


def mean_spread(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[tuple, float, float, int]]:
    """Per group of `keys`: mean NE, its sample sd over the group (0 for one row) and the row count."""
    ne = [(*(r[k] for k in keys), float(r["ne"])) for r in rows if r.get("ne") is not None and math.isfinite(r["ne"])]
    df = (pl.DataFrame(ne, schema=[*keys, "ne"], orient="row").group_by(keys)
          .agg(pl.col("ne").mean().alias("m"), pl.col("ne").std().fill_null(0.0).alias("sd"), pl.len()).sort(keys))
    return [(tuple(r[:-3]), *r[-3:]) for r in df.iter_rows()]


EVAL_SIMULATOR = "eval"  # assets/simulator_eval.yaml
EVAL_HOME = "eval_world"  # under $GEM_HOME: the evaluation world never mixes with the demo's state


def use_eval_world() -> Path:
    """Point GEM_HOME, DAGSTER_HOME and GEM_SIMULATOR of this process at the evaluation world."""
    home = gem_home() / EVAL_HOME
    os.environ["GEM_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    os.environ["GEM_SIMULATOR"] = EVAL_SIMULATOR
    return home


class EvalWorld:
    """Builds the evaluation world stage by stage through the Dagster jobs `make demo` runs; a stage
    already done in this world is skipped (a marker per stage, written after it succeeded)."""

    def __init__(self) -> None:
        from gem_pipelines.code_location import CodeLocation
        from gem_pipelines.instance import get_instance
        from gem_pipelines.partitions import CALENDAR, SURFACES

        self.location = CodeLocation(get_instance())
        self.dates = [d.isoformat() for d in CALENDAR.dates()]
        self.surfaces = SURFACES
        self.done = gem_home() / "eval_world_stages"
        self.done.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, job: str, keys: list[str | None], ops: dict | None = None) -> str:
        """Run `job` for every key unless stage `name` is done; returns what its marker holds."""
        from gem_pipelines.demo import _run

        marker = self.done / name
        if marker.exists():
            print(f"  {name}: already built", flush=True)
            return marker.read_text().strip()
        t, before = time.time(), set(list_versions(FOUNDATION_ASSET))
        for key in keys:
            _run(self.location, job, key, ops)
        new = sorted(set(list_versions(FOUNDATION_ASSET)) - before)
        marker.write_text(new[-1] if new else "done")
        print(f"  {name}: {time.time() - t:.0f}s", flush=True)
        return marker.read_text().strip()

    def data(self) -> None:
        """Ingest and features of every day of the calendar."""
        from gem_pipelines.partitions import multi_key

        self.stage("ingest", "land_and_ingest_job",
                   [str(multi_key(d, s)) for d in self.dates for s in self.surfaces.names])
        self.stage("features", "features_job", list(self.dates))

    def teacher(self, preset: str, seed: int) -> dict[str, Any]:
        """The pipeline's foundation_model run (cold start, this seed, single-surface baselines, quality
        gate): the protocol's first seed and, once ACCEPTED, the arms' teacher (one training serves both)."""
        ops = {"foundation_model": {"config": {"preset": preset, "seeds": [seed], "baselines": True,
                                               "warm_start": False}}}
        version = self.stage(f"foundation_s{seed}", "foundation_job", [None], ops)
        vdir = version_dir(FOUNDATION_ASSET, version)
        rows = json.loads((vdir / "eval_rows.json").read_text())["rows"]
        return {"version": version, "version_dir": str(vdir), "rows": rows, "seeds": [seed]}

    def domain_teachers(self) -> None:
        """Domain models and the teacher predictions of every day (the distillation arms' targets)."""
        self.stage("domain_models", "domain_models_job", list(self.surfaces.domains))
        self.stage("teacher_predictions", "teacher_predictions_job", list(self.dates[1:]))


def start_distillation_beside(args: argparse.Namespace, env: dict[str, str], log: Path) -> subprocess.Popen:
    """The distillation arms in a second process (`--distillation-only`), beside seeds 1.. of the
    protocol: they need only seed 0's teacher, and the two halves in turn take longer than the hour.
    Each process gets half the cores (torch's default, all of them in both, oversubscribes). `env`
    is the environment from before use_eval_world(), which the child applies itself."""
    threads = max(1, (os.cpu_count() or 2) // 2)
    import torch

    torch.set_num_threads(threads)
    cmd = [sys.executable, "-m", "gem_pipelines.evaluate", "--distillation-only", "--world", args.world,
           "--preset", args.preset, "--seeds", *map(str, args.seeds), *(["--arms", *args.arms] if args.arms else [])]
    print(f"distillation arms beside the protocol ({threads} thread(s) each) -> {log}", flush=True)
    with log.open("w") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, env={**env, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}, stdout=f,
                                stderr=subprocess.STDOUT)


def protocol(args: argparse.Namespace, world: EvalWorld | None, out_dir: Path, t0: float) -> None:
    """Foundation, single-surface, base rate and logistic regression, one seed at a time, each a
    complete comparison: the report is rewritten after every seed, so a cut-short run still reports
    the seeds it did."""
    from gem_model.train.foundation import run_foundation, write_eval_report

    results: list[dict] = []
    rows: list[dict] = []
    for i, seed in enumerate(args.seeds):
        if world is not None and i == 0:
            result = world.teacher(args.preset, seed)
        else:
            result = run_foundation(args.preset, seeds=(seed,), baselines=True)
        results.append(result)
        rows += result["rows"] + run_lr_baselines(result, [seed])
        quality = model_quality(results, [r["seeds"][0] for r in results])
        path = write_eval_report(rows, out_dir / "foundation_eval_3seeds.json", extra={"quality": quality})
        md = write_text(out_dir / "model_quality.md", quality_markdown(quality, len(results), time.time() - t0))
        print(f"\nafter seed {seed}:\n" + md.read_text(), flush=True)
    result = results[0]
    print(f"\nfoundation ({len(args.seeds)} seeds, click NE on E, mean +- sd)  -> {path}")
    for (model, surface, task), m, sd, n in mean_spread(rows, ("model", "surface", "task")):
        if task == "click":
            print(f"  {model:<15} {surface:<12} {m:.4f} +- {sd:.4f}  (n={n})")
    oracle = {r["surface"]: r["oracle_ne"] for r in result["rows"] if r["task"] == "click"}
    if any(v is None for v in oracle.values()):  # real logs (GEM_DATA): no true probabilities
        print("  oracle floor    none (real data): see reports/real_data_report.md for bootstrap intervals")
    else:
        print("  oracle floor    " + "  ".join(f"{s}={v:.4f}" for s, v in sorted(oracle.items())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--preset", default=env_value("GEM_MODEL_PRESET"))
    parser.add_argument("--skip-distillation", action="store_true")
    parser.add_argument("--world", choices=["eval", "demo"], default="eval",
                        help="eval: assets/simulator_eval.yaml in $GEM_HOME/eval_world (simulator only); "
                             "demo: the lake `make demo` built")
    parser.add_argument("--distillation-only", action="store_true",
                        help="only the distillation arms (e.g. beside a --skip-distillation run, once its "
                             "first seed, the teacher, is done)")
    parser.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), metavar="ARM",
                        help=f"the distillation arms to train (default: every one of {', '.join(ARMS)})")
    parser.add_argument("--build-only", choices=["features", "teachers"],
                        help="build the evaluation world up to this stage, then stop")
    parser.add_argument("--rescore-versions", nargs="+", metavar="VERSION",
                        help="foundation_model versions, one per --seeds entry in that order, already trained "
                             "(with their baselines): write reports/model_quality_rescored.{md,json} from their "
                             "saved predictions on E with this code, without training")
    parser.add_argument("--refit-baselines", action="store_true",
                        help="with --rescore-versions: train the base rate and the logistic regression again "
                             "beside each version first (seconds to minutes; the foundations are not retrained)")
    args = parser.parse_args(argv)
    if args.refit_baselines and not args.rescore_versions:
        parser.error("--refit-baselines goes with --rescore-versions")
    t0 = time.time()
    env = dict(os.environ)  # before use_eval_world(): what a second evaluate process starts from
    out_dir = reports_dir()  # the reports land where `make demo` puts its own, whatever the world
    world: EvalWorld | None = None
    if args.world == "eval" and dataset_name() == SIM:
        home = use_eval_world()
        print(f"evaluation world (assets/simulator_{EVAL_SIMULATOR}.yaml) in {home}", flush=True)
        world = EvalWorld()
        world.data()
        print(f"  data ready after {time.time() - t0:.0f}s", flush=True)
        if args.build_only == "teachers":
            world.teacher(args.preset, args.seeds[0])
            world.domain_teachers()
    if args.build_only:
        return
    if args.rescore_versions:  # the table again from versions already trained (no training)
        results = [{"version_dir": str(version_dir(FOUNDATION_ASSET, v)), "seeds": [s]}
                   for v, s in zip(args.rescore_versions, args.seeds, strict=True)]
        if args.refit_baselines:  # the base rate and the LR again, beside each version (their code changed)
            for result in results:
                run_lr_baselines(result, result["seeds"])
        quality = model_quality(results, list(args.seeds))
        write_json(out_dir / "model_quality_rescored.json", quality)
        md = write_text(out_dir / "model_quality_rescored.md", quality_markdown(quality, len(results), time.time() - t0))
        print(md.read_text(), flush=True)
        return
    from gem_model.distill import DEFAULT_PATHS, run_distillation, write_report

    beside: subprocess.Popen | None = None
    arms_log = out_dir / "eval_distillation.log"
    if not args.distillation_only and not args.skip_distillation and world is not None:
        world.teacher(args.preset, args.seeds[0])  # seed 0 of the protocol, the arms' teacher
        beside = start_distillation_beside(args, env, arms_log)
    try:
        if not args.distillation_only:
            protocol(args, world, out_dir, t0)
        elif world is not None:
            world.teacher(args.preset, args.seeds[0])  # the teacher (its stage marker when seed 0 is done)
    except BaseException:
        if beside is not None:
            beside.terminate()  # the protocol failed or was interrupted: do not leave the arms running
        raise
    if beside is not None:
        rc = beside.wait()
        print("\n" + "".join(arms_log.read_text().splitlines(keepends=True)[-40:]), flush=True)
        if rc != 0:
            raise SystemExit(f"the distillation arms failed (exit {rc}): see {arms_log}")
    elif not args.skip_distillation:
        if world is not None:
            world.domain_teachers()
        # the pipeline's ACCEPTED teachers: their predictions are the teacher_predictions the arms distil
        # (the foundation's tables are the ones parameter_sharing copies)
        import dagster as dg

        from gem_pipelines.assets.students import teacher_checkpoints

        try:
            teachers = teacher_checkpoints()
        except dg.Failure as missing:
            raise SystemExit(f"{missing.description}: run `make demo` first") from None
        rows = run_distillation(args.arms or list(ARMS), list(DEFAULT_PATHS), args.seeds, preset=args.preset,
                                teachers=teachers)
        path = write_report(rows, out_dir / "distillation_report_3seeds.json")
        from gem_model.distill.kd_intervals import intervals_from_rows, intervals_markdown

        kd_md = write_text(out_dir / "distillation_kd_gains.md", intervals_markdown(intervals_from_rows(rows)))
        print(f"\nKD gains over labels_only (-> {kd_md}):\n" + kd_md.read_text(), flush=True)
        print(f"\ndistillation (click NE on E, mean +- sd over seeds)  -> {path}")
        for (arm, p, surface, split, task), m, sd, _n in mean_spread(rows, ("arm", "path", "surface", "split", "task")):
            if task == "click" and split == "evaluation":
                print(f"  {arm:<18} {p:<13} {surface:<12} {m:.4f} +- {sd:.4f}")
    what = "the distillation arms" if args.distillation_only else "make eval"
    print(f"\n{what} took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
