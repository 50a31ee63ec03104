"""`make demo`: materialize the whole asset graph for the calendar window through the instance
at $GEM_HOME/dagster, as real runs of the workspace's code location (each listed on its job page),
then switch the automation on, so `make ui` afterwards shows every run, check result and a living
system."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from dagster import DagsterRunStatus

from gem_model.store.paths import gem_home, lake_root, reports_dir
from gem_pipelines.next_day import rejected_by_gate, start_automation

if TYPE_CHECKING:  # imported in main(): they read the specs, whose errors run_main reports as such
    from gem_pipelines.code_location import CodeLocation


def _run(location: CodeLocation, job: str, partition_key: str | None = None, ops: dict | None = None, *,
         model: bool = False) -> bool:
    """One real run of `job` (ops: per-op run config, e.g. {"foundation_model": {"config": {...}}}); returns
    whether a quality gate refused its new model. For a `model` job that is no reason to stop: the gate did
    its job, and whatever needs an ACCEPTED version of that model then fails and says so. Any other failed
    run stops the demo, a blocking data check included."""
    t = time.time()
    run = location.launch(job, partition_key=partition_key, tags={"gem/trigger": "demo"},
                          run_config={"ops": ops} if ops else None)
    ok = run.status == DagsterRunStatus.SUCCESS
    refused = model and not ok and rejected_by_gate(location.instance, run.run_id)
    outcome = "ok" if ok else f"REFUSED by its quality gate, run {run.run_id}" if refused else "FAILED"
    print(f"  {job:<24} {partition_key or '':<24} {outcome} ({time.time() - t:.1f}s)", flush=True)
    if not ok and not refused:
        for record in location.instance.all_logs(run.run_id):
            if record.dagster_event and record.dagster_event.is_failure:
                print(record.message, file=sys.stderr)
        raise SystemExit(f"{job} {partition_key or ''} failed: see run {run.run_id} in `make ui`")
    return refused


def model_stages(dates: list[str]) -> list[tuple[str, list[str | None]]]:
    """The training half of the graph, in dependency order, with the partitions each stage runs."""
    from gem_pipelines.partitions import SURFACES

    return [
        ("foundation_job", [None]),
        ("domain_models_job", SURFACES.domains),
        ("teacher_predictions_job", list(dates[1:])),  # the warm-up day has no role: no partition
        ("distillation_report_job", [None]),
        ("students_job", SURFACES.names),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--through", choices=["ingest", "features", "all"], default="all")
    parser.add_argument("--models-only", action="store_true", help="skip ingest and features (already materialized)")
    args = parser.parse_args(argv)
    start = time.time()
    from gem_pipelines import sources  # GEM_DATA=<dataset>: its files go to landing/ first (no-op for sim)
    from gem_pipelines.code_location import CodeLocation
    from gem_pipelines.instance import get_instance

    # before the code location loads: a timed dataset's import writes the calendar its partitions read
    note = None if args.models_only else sources.before_ingest()
    instance = get_instance()
    location = CodeLocation(instance)
    from gem_pipelines.partitions import CALENDAR, SURFACES, multi_key

    dates = [d.isoformat() for d in CALENDAR.dates()]
    print(f"GEM demo: {len(dates)} days x {len(SURFACES.names)} surfaces, GEM_HOME={gem_home()}", flush=True)
    if note:
        print(f"  {note}", flush=True)
    for d in dates if not args.models_only else []:
        for s in SURFACES.names:
            _run(location, "land_and_ingest_job", str(multi_key(d, s)))
    if args.through in ("features", "all") and not args.models_only:
        for d in dates:
            _run(location, "features_job", d)
    reports = [sources.after_ingest()] if not args.models_only else []
    refused = []
    if args.through == "all":
        refused = [f"{job}[{key or ''}]" for job, keys in model_stages(dates) for key in keys
                   if _run(location, job, key, model=True)]
        reports.append(sources.after_models())
        for line in start_automation(location):
            print(f"  automation: {line}")
    print(f"\nDone in {time.time() - start:.0f}s.")
    if refused:
        print(f"  refused by their quality gates (no version of them serves until one passes): {', '.join(refused)}")
    for line in filter(None, reports):
        print(f"  {line}")
    print(f"  lake (Delta tables):  {lake_root()}")
    print(f"  reports, Data Docs:   {reports_dir()}")
    print(f"  Dagster instance:     {instance.root_directory}  (run `make ui` and open http://127.0.0.1:3000)")


if __name__ == "__main__":
    from gem_pipelines.cli import run_main

    run_main(main)
