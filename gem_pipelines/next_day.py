"""`make next-day`: one more day of the simulated world, handled by the automation alone.

The simulator's clock moves one day (gem_model.clock: the window gains a day, so every day role
moves with E), then the automation does what the daemon would do, tick by tick, without a daemon:
the daily schedule lands and ingests the new day, the landing sensor looks for raw files nobody
ingested, and the automation conditions are evaluated (`dg.evaluate_automation_conditions`) until
they request nothing more; every requested run is a real run of the code location, executed here.
Each day ends with a report ($GEM_HOME/reports/days_in_the_life.md, gem_pipelines/day_report.py);
`--days 7` (`make week`) runs seven days.

Run it with the UI stopped (or its automation sensor off): a running daemon would evaluate the same
conditions on its own cursor and launch the same runs a second time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from gem_model.store.atomic import write_json, write_text
from gem_model.store.paths import gem_home, reports_dir

if TYPE_CHECKING:
    from gem_pipelines.code_location import CodeLocation

Cursor = Any  # opaque: what `dg.evaluate_automation_conditions` returns and takes, on disk in Dagster's serializer

MAX_WAVES = 12  # the longest chain (ingest -> features -> teacher -> domains -> predictions -> report -> students) is 7
DAEMON_FRESH_S = 120


def simulated_today() -> dt.date:
    """The simulator's today: the day after the window's last day E ("yesterday" is E)."""
    from gem_pipelines.partitions import CALENDAR

    return CALENDAR.end() + dt.timedelta(days=1)


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime.combine(simulated_today(), dt.time(hour, minute), tzinfo=dt.UTC)


def _cursor_path():
    return gem_home() / "automation_cursor.json"


def _load_cursor() -> Cursor | None:
    path = _cursor_path()
    return dg.deserialize_value(path.read_text()) if path.exists() else None


def _save_cursor(cursor: Cursor) -> None:
    write_text(_cursor_path(), dg.serialize_value(cursor))


def _defs() -> dg.Definitions:
    from gem_pipelines.definitions import defs

    return defs


def automation_requests(result: dg.EvaluateAutomationConditionsResult, defs: dg.Definitions) -> list[dg.RunRequest]:
    """One run per (partitions definition, partition key), assets in dependency order, as the daemon
    groups what one tick requested."""
    graph = defs.resolve_asset_graph()
    groups: dict[tuple[int, str | None], list[dg.AssetKey]] = {}
    defs_seen: list[dg.PartitionsDefinition | None] = []
    for key in graph.toposorted_asset_keys:
        pdef = graph.get(key).partitions_def
        if pdef not in defs_seen:
            defs_seen.append(pdef)
        for pk in sorted(result.get_requested_partitions(key), key=str):
            groups.setdefault((defs_seen.index(pdef), pk), []).append(key)
    from gem_pipelines.jobs import automation_job_for

    # under the job that holds the assets (an asset subset of it): the job pages list the run
    return [
        dg.RunRequest(asset_selection=keys, partition_key=pk, job_name=automation_job_for(keys),
                      tags={"gem/trigger": "automation"})
        for (_, pk), keys in groups.items()
    ]


def _request_key(request: dg.RunRequest) -> tuple[tuple[str, ...], str | None]:
    return tuple(sorted(k.to_user_string() for k in request.asset_selection or [])), request.partition_key


def frontier(requests: list[dg.RunRequest], defs: dg.Definitions) -> list[dg.RunRequest]:
    """The requests none of whose assets has an ancestor among the other requests: a child run beside its
    parent's would read the old parent and not be requested again, so it waits, still requested."""
    graph = defs.resolve_asset_graph()
    out = []
    for request in requests:
        own = set(request.asset_selection or [])
        others = {k for r in requests if r is not request for k in (r.asset_selection or [])} - own
        if not any(graph.get_ancestor_asset_keys(k) & others for k in own):
            out.append(request)
    return out


def evaluate(instance: dg.DagsterInstance, when: dt.datetime, *, fresh: bool = False) -> list[dg.RunRequest]:
    """One evaluation on the cursor kept on disk (`fresh`: on none), which it then replaces."""
    defs = _defs()
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=when,
                                               cursor=None if fresh else _load_cursor())
    _save_cursor(result.cursor)
    return automation_requests(result, defs)


def start_automation(location: CodeLocation) -> list[str]:
    """Switch every schedule and sensor on, as the UI's toggles would, and hand the landing sensor a
    cursor that already knows the files the demo ingested (it must not ingest them again)."""
    from gem_pipelines.sensors import landing_cursor, landing_sensor

    started = []
    for schedule in location.repo.get_schedules():
        location.start_schedule(schedule.name)
        started.append(f"{schedule.name} RUNNING")
    for sensor in location.repo.get_sensors():
        cursor = landing_cursor() if sensor.name == landing_sensor.name else None
        location.start_sensor(sensor.name, cursor=cursor)
        started.append(f"{sensor.name} RUNNING" + (f" (cursor: {len(json.loads(cursor))} partitions)" if cursor else ""))
    evaluate(location.instance, at(5), fresh=True)  # the demo built everything: later ticks see only changes
    return started


def _describe(request: dg.RunRequest) -> str:
    assets = ",".join(k.to_user_string() for k in request.asset_selection or [])
    return f"{assets or request.job_name}[{request.partition_key or ''}]"


def _refuse_if_daemon_runs(instance: dg.DagsterInstance) -> None:
    now = time.time()
    for daemon, beat in (instance.get_daemon_heartbeats() or {}).items():
        if now - beat.timestamp < DAEMON_FRESH_S:
            raise SystemExit(f"dagster-daemon ({daemon}) is running on {instance.root_directory}: stop `make ui` "
                             "first, or it would launch the same runs as `make next-day`")


def rejected_by_gate(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether every step that failed in the run failed on a blocking asset check: a quality gate refused
    a new model, which is the gate doing its job (the ACCEPTED one keeps serving), not a broken run."""
    failures = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    errors = [e.dagster_event.step_failure_data.error for e in failures if e.dagster_event]
    return bool(errors) and all(err is not None and err.cls_name == "DagsterAssetCheckFailedError" for err in errors)


class _Launcher:
    """Executes requested runs one after another, logging each and keeping the ids of the failed runs
    apart from those whose only failure is a gate's refusal."""

    def __init__(self, location: CodeLocation, log=print):
        self.location, self.log, self.failed, self.rejected = location, log, [], []

    def __call__(self, trigger: str, requests: list[dg.RunRequest], job_name: str | None = None) -> list[str]:
        names = []
        for request in requests:
            run = self.location.launch_request(request, job_name=job_name)
            names.append(_describe(request) if request.asset_selection else f"{job_name}[{request.partition_key}]")
            if run.status == dg.DagsterRunStatus.SUCCESS:
                outcome = "ok"
            elif rejected_by_gate(self.location.instance, run.run_id):
                outcome = f"REJECTED by its quality gate {run.run_id}"
                self.rejected.append(names[-1])
            else:
                outcome = f"FAILED {run.run_id}"
                self.failed.append(run.run_id)
            self.log(f"  {trigger:<10} {names[-1]:<60} {outcome}")
        return names


def run_automation(location: CodeLocation, hour: int, launch: _Launcher) -> dict[str, list]:
    """Evaluate the automation conditions (one evaluation a minute from `hour`:00 of the simulated today) and
    run what they request, parents first, until nothing more: the waves, what waits below a failed run, the stale."""
    waves: list[list[str]] = []
    pending: dict[tuple, dg.RunRequest] = {}  # requested, waiting for their ancestors' runs
    for wave in range(MAX_WAVES):
        requests = evaluate(location.instance, at(hour, wave))
        pending.update({_request_key(r): r for r in requests})
        ready = frontier(list(pending.values()), _defs())
        if not ready:
            break
        for request in ready:
            del pending[_request_key(request)]
        waves.append(launch("automation", ready))
    from gem_pipelines.staleness import mark_stale

    # what waits on purpose (a model on its cadence) says so on its page instead of looking current
    stale = mark_stale(location.instance, _defs().resolve_asset_graph())
    return {"automation": waves, "not_run": [_describe(r) for r in pending.values()], "stale": sorted(stale)}


def run_day(location: CodeLocation, log=print) -> dict[str, object]:
    """The automation of one simulated day; returns what each trigger requested, in order."""
    from gem_pipelines.schedules import daily_ingest_schedule
    from gem_pipelines.sensors import landing_sensor

    instance = location.instance
    _refuse_if_daemon_runs(instance)
    summary: dict[str, object] = {"today": simulated_today().isoformat()}
    launch = _Launcher(location, log)

    # The window grew by a day, so the time-partitioned assets' conditions start afresh (Dagster keeps
    # no condition state across a changed partitions definition): evaluate once before the new day
    # lands, so the evaluations after it see the landing as an update.
    summary["before_landing"] = launch("automation", evaluate(instance, at(1, 0)))

    with dg.build_schedule_context(instance=instance, scheduled_execution_time=at(1, 30)) as ctx:
        result = daily_ingest_schedule(ctx)
    requests = [] if isinstance(result, dg.SkipReason) else list(result)
    summary["schedule"] = launch("schedule", requests, daily_ingest_schedule.job_name)

    ctx = dg.build_sensor_context(instance=instance, cursor=location.sensor_cursor(landing_sensor.name))
    result = landing_sensor(ctx)
    location.set_sensor_cursor(landing_sensor.name, ctx.cursor)
    requests = [] if isinstance(result, dg.SkipReason) else list(result)
    summary["sensor"] = launch("sensor", requests, landing_sensor.job_name)

    summary.update(run_automation(location, 5, launch))
    summary["failed"], summary["rejected"] = launch.failed, launch.rejected
    return summary


def _several_days(days: int, summary_path: str | None) -> None:
    """`make week`: one day after another, each in a fresh process (the code location's partitions and
    day roles are read at import, from the clock)."""
    import subprocess
    import sys
    import tempfile

    from gem_pipelines import day_report

    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(days):
            out = f"{tmp}/day{i}.json"
            proc = subprocess.run([sys.executable, "-m", "gem_pipelines.next_day", "--summary", out], check=False)
            if Path(out).exists():
                summaries.append(json.loads(Path(out).read_text()))
            if proc.returncode != 0:
                raise SystemExit(f"day {i + 1} of {days} failed (exit {proc.returncode}): the days after it were not run")
    if summary_path:
        write_json(summary_path, summaries)
    print(f"{days} days done: {reports_dir() / (day_report.REPORT + '.md')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=1, help="simulate this many days, one after another "
                        "(`make week`: 7)")
    parser.add_argument("--summary", help="also write what each trigger requested to this JSON file "
                        "(with --days > 1: a list, one entry per day)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be at least 1")
    from gem_model.config import SIM, dataset_name

    if (name := dataset_name()) != SIM:  # a real log has no next day to simulate: its days are its files'
        raise SystemExit(f"make next-day simulates the next day of the simulated world; GEM_DATA={name} is a "
                         "dataset whose days come from its files")
    if args.days > 1:
        return _several_days(args.days, args.summary)
    from gem_model import clock
    from gem_pipelines import day_report
    from gem_pipelines.instance import get_instance

    start = time.time()
    instance = get_instance()
    _refuse_if_daemon_runs(instance)
    before = day_report.accepted_versions()
    clock.advance(1)  # before the code location loads: its partitions and day roles include the new day
    from gem_pipelines.code_location import CodeLocation

    evaluation_day = simulated_today() - dt.timedelta(days=1)
    print(f"GEM next day: the simulator's today is {simulated_today()}, E = {evaluation_day}")
    summary = run_day(CodeLocation(instance))
    summary["wall_s"] = round(time.time() - start, 1)
    summary["retrained"] = day_report.retrained(before, day_report.accepted_versions())
    day_report.write_day(evaluation_day, summary, summary["retrained"], summary["wall_s"])  # type: ignore[arg-type]
    report = day_report.render(instance)
    if args.summary:
        write_json(args.summary, summary)
    if summary["rejected"]:
        print(f"Refused by their quality gates (the ACCEPTED models keep serving): {', '.join(summary['rejected'])}")
    print(f"Done in {time.time() - start:.0f}s; report: {report}; reload definitions in `make ui` to see the new day.")
    if summary["failed"]:
        raise SystemExit(f"{len(summary['failed'])} run(s) failed: {summary['failed']}")


if __name__ == "__main__":
    from gem_pipelines.cli import run_main

    run_main(main)
