"""`make demo`: materialize the whole asset graph for the calendar window through the instance
at $GEM_HOME/dagster, so `make ui` afterwards shows every run and check result."""

from __future__ import annotations

import argparse
import sys
import time

import dagster as dg

from gem_model.paths import gem_home, lake_root, reports_dir
from gem_pipelines.instance import get_instance

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _run(defs: dg.Definitions, job: str, instance: dg.DagsterInstance, partition_key: str | None = None) -> None:
    t = time.time()
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, partition_key=partition_key, raise_on_error=False, run_config=QUIET
    )
    status = "ok" if result.success else "FAILED"
    print(f"  {job:<24} {partition_key or '':<24} {status} ({time.time() - t:.1f}s)", flush=True)
    if not result.success:
        for event in result.all_events:
            if event.is_failure:
                print(event.message, file=sys.stderr)
        raise SystemExit(f"{job} {partition_key or ''} failed: see the run in `make ui`")


def model_stages(dates: list[str]) -> list[tuple[str, list[str | None]]]:
    """The training half of the graph, in dependency order, with the partitions each stage runs."""
    from gem_pipelines.partitions import SURFACES

    return [
        ("foundation_job", [None]),
        ("domain_models_job", SURFACES.domains),
        ("teacher_predictions_job", list(dates[1:])),
        ("distillation_report_job", [None]),
        ("students_job", SURFACES.names),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--through", choices=["ingest", "features", "all"], default="all")
    parser.add_argument("--models-only", action="store_true", help="skip ingest and features (already materialized)")
    args = parser.parse_args(argv)
    start = time.time()
    instance = get_instance()
    from gem_pipelines.definitions import defs
    from gem_pipelines.partitions import CALENDAR, SURFACES, multi_key

    dates = [d.isoformat() for d in CALENDAR.dates()]
    print(f"GEM demo: {len(dates)} days x {len(SURFACES.names)} surfaces, GEM_HOME={gem_home()}", flush=True)
    from gem_pipelines import sources  # GEM_DATA=<dataset>: its files go to landing/ first (no-op for sim)

    if not args.models_only and (note := sources.before_ingest()):
        print(f"  {note}", flush=True)
    for d in dates if not args.models_only else []:
        for s in SURFACES.names:
            _run(defs, "land_and_ingest_job", instance, str(multi_key(d, s)))
    if args.through in ("features", "all") and not args.models_only:
        for d in dates:
            _run(defs, "features_job", instance, d)
    reports = [sources.after_ingest()] if not args.models_only else []
    if args.through == "all":
        for job, keys in model_stages(dates):
            for key in keys:
                _run(defs, job, instance, key)
        reports.append(sources.after_models())
    print(f"\nDone in {time.time() - start:.0f}s.")
    for line in filter(None, reports):
        print(f"  {line}")
    print(f"  lake (Delta tables):  {lake_root()}")
    print(f"  reports, Data Docs:   {reports_dir()}")
    print(f"  Dagster instance:     {instance.root_directory}  (run `make ui` and open http://127.0.0.1:3000)")


if __name__ == "__main__":
    main()
