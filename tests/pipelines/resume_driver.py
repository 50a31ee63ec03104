"""Training runs that die midway, through the code location, written out as JSON: each run's status and lineage, the
versions on disk (resumed step, gate record, checkpoint), ACCEPTED and what the UI shows.

`reexecute`: a foundation_model run fails midway, is re-executed as the UI's "Re-execute" does, then a new run
starts; a domain_models run fails and is re-executed (step retries off). `retry`: runs as `make ui` launches them
(Dagster's multiprocess executor: each step in a child process), retried by their steps' retry policy: a
students run whose training fails midway, a foundation_job run whose training process is SIGKILLed midway.
`submit`: a foundation_job run queued for the daemon, as the UI submits it; `orphan`: one executed here, as `make
demo` runs it, killed midway with this process; `orphaned`: what the daemon made of them.

Run as a script by tests/pipelines/test_resume_training.py on a copy of the demo world whose tiny presets fail at
step 2, after that step's checkpoint (`fail_at_step`); the calendar, presets and retries come from
GEM_ASSETS_DIR, read at import, hence a fresh process: `python resume_driver.py <mode> <out.json>`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dagster as dg

from gem_model.models.registry import list_versions, read_accepted
from gem_model.store.paths import models_dir
from gem_pipelines.code_location import CodeLocation
from gem_pipelines.instance import get_instance

# a cold teacher alone: the failure hits it, not a baseline after it
CONFIG = {"ops": {"foundation_model": {"config": {"baselines": False, "warm_start": False}}}}


def shown(asset: str, partition: str | None = None) -> int | None:
    """The newest materialization's `resumed_from_step` (what the UI shows), None when absent."""
    (record,) = get_instance().fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1).records
    value = record.asset_materialization.metadata.get("resumed_from_step")
    return None if value is None else value.value


def state(asset: str, partition: str | None, v: str) -> dict:
    d = models_dir(asset, partition) / v
    metrics = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else {}
    return {"resumed_from_step": metrics.get("resumed_from_step"), "step": metrics.get("step", metrics.get("steps")),
            "gated": (d / "gate.json").is_file(), "checkpoint": (d / "checkpoint.pt").is_file()}


def reexecute() -> dict:
    location = CodeLocation(get_instance())
    known = set(list_versions("foundation_model"))
    runs = []
    first = location.launch("foundation_job", run_config=CONFIG, tags={"gem/trigger": "ui"})
    runs.append(first)
    after_failure = sorted(set(list_versions("foundation_model")) - known)
    runs.append(location.reexecute(first))
    runs.append(location.launch("foundation_job", run_config=CONFIG, tags={"gem/trigger": "ui"}))
    versions = sorted(set(list_versions("foundation_model")) - known)
    # a domain model failing the same way, then re-executed
    known_domain = set(list_versions("domain_models", "commerce"))
    domain_runs = [location.launch("domain_models_job", partition_key="commerce", tags={"gem/trigger": "ui"})]
    domain_after_failure = sorted(set(list_versions("domain_models", "commerce")) - known_domain)
    domain_runs.append(location.reexecute(domain_runs[0]))
    return {
        "runs": [{"run_id": r.run_id, "status": r.status.value, "root_run_id": r.root_run_id,
                  "parent_run_id": r.parent_run_id, "trigger": r.tags.get("gem/trigger")} for r in runs],
        "after_failure": after_failure,
        "versions": {v: state("foundation_model", None, v) for v in versions},
        "accepted": getattr(read_accepted("foundation_model"), "name", None),
        "materialized_by": [e.run_id for e in get_instance().fetch_materializations(
            dg.AssetKey("foundation_model"), limit=10).records],
        "resumed_shown": shown("foundation_model"),
        "domain": {
            "runs": [{"run_id": r.run_id, "status": r.status.value, "root_run_id": r.root_run_id} for r in domain_runs],
            "after_failure": domain_after_failure,
            "versions": {v: state("domain_models", "commerce", v)
                         for v in sorted(set(list_versions("domain_models", "commerce")) - known_domain)},
            "accepted": getattr(read_accepted("domain_models", "commerce"), "name", None),
            "resumed_shown": shown("domain_models", "commerce"),
        },
    }


def retry() -> dict:
    instance = get_instance()
    location = CodeLocation(instance)
    as_ui = {"execution": {"config": {"multiprocess": {}}}}  # each step in a child process, as `make ui` runs it

    def launched(job: str, **kwargs) -> tuple[dg.DagsterRun, list[dg.DagsterEvent], int]:
        before = len(instance.get_run_records(dg.RunsFilter(job_name=job)))
        run = location.launch(job, tags={"gem/trigger": "ui"}, **kwargs)
        events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.dagster_event]
        return run, events, len(instance.get_run_records(dg.RunsFilter(job_name=job))) - before

    def retries(events: list[dg.DagsterEvent]) -> list[dict]:
        def chain(err) -> str:  # a raised error reaches the policy as the cause of its RetryRequestedFromPolicy
            return err.message + (" <- " + chain(err.cause) if err.cause else "")

        return [{"step": e.step_key, "error": chain(e.event_specific_data.error)} for e in events
                if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]

    # the production student of one surface, its training failing after its step-2 checkpoint
    known_students = set(list_versions("students", "feed"))
    student, student_events, student_runs = launched("students_job", partition_key="feed", run_config=as_ui)
    (student_version,) = sorted(set(list_versions("students", "feed")) - known_students)
    student_dir = models_dir("students", "feed") / student_version
    # the teacher, its training process SIGKILLed after its step-2 checkpoint
    known = set(list_versions("foundation_model"))
    run, events, runs = launched("foundation_job", run_config={**CONFIG, **as_ui})
    versions = sorted(set(list_versions("foundation_model")) - known)
    return {
        "status": run.status.value,
        "new_runs": runs,
        "retries": retries(events),
        "step_failures": sum(e.event_type == dg.DagsterEventType.STEP_FAILURE for e in events),
        "versions": {v: state("foundation_model", None, v) for v in versions},
        "accepted": getattr(read_accepted("foundation_model"), "name", None),
        "resumed_shown": shown("foundation_model"),
        "student": {
            "status": student.status.value, "new_runs": student_runs, "retries": retries(student_events),
            "resumed_from_step": json.loads((student_dir / "metrics.json").read_text())["train"]["resumed_from_step"],
            "gated": (student_dir / "gate.json").is_file(),
            "checkpoints_left": sorted(p.name for p in student_dir.glob("checkpoint-*.pt")),
            "resumed_shown": shown("students", "feed"),
        },
    }


def submit() -> dict:
    """A foundation_job run submitted as the UI's "Materialize" submits it: queued, for the daemon to launch."""
    instance = get_instance()
    run = CodeLocation(instance).create_run("foundation_job", run_config=CONFIG, tags={"gem/trigger": "ui"})
    instance.submit_run(run.run_id, workspace=None)  # type: ignore[arg-type]  # the queue needs none
    return {"run_id": run.run_id, "known": list_versions("foundation_model")}


def orphan(out: str) -> dict:
    """A foundation_job run executed in this process, as `make demo` runs it, killed with it after its step-2
    checkpoint; nothing is left to say the run ended. The run id is written to `out` first; returns only if the
    kill did not happen."""
    instance = get_instance()
    known = set(instance.get_run_ids(dg.RunsFilter(job_name="foundation_job")))
    location = CodeLocation(instance)
    Path(out).write_text(json.dumps({"known_runs": sorted(known)}))  # written before the kill
    run = location.launch("foundation_job", run_config=CONFIG, tags={"gem/trigger": "demo"})
    return {"unexpectedly_finished": run.status.value}


def orphaned() -> dict:
    """After `orphan` and the daemon: the foundation_job runs and their lineage, the versions, ACCEPTED, what the
    UI shows, and why each failed run failed."""
    instance = get_instance()
    records = sorted(instance.get_run_records(dg.RunsFilter(job_name="foundation_job")), key=lambda r: r.create_timestamp)
    runs = [r.dagster_run for r in records]
    return {
        "runs": [{"run_id": r.run_id, "status": r.status.value, "root_run_id": r.root_run_id,
                  "parent_run_id": r.parent_run_id, "retry_number": r.tags.get("dagster/retry_number"),
                  "executor": next(iter(r.run_config.get("execution", {}).get("config", {})), None),
                  "failure": [e.message for e in instance.all_logs(r.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)]}
                 for r in runs],
        "versions": {v: state("foundation_model", None, v) for v in list_versions("foundation_model")},
        "accepted": getattr(read_accepted("foundation_model"), "name", None),
        "resumed_shown": shown("foundation_model"),
    }


if __name__ == "__main__":
    mode, out = sys.argv[1:]
    modes = {"reexecute": reexecute, "retry": retry, "submit": submit, "orphan": lambda: orphan(out),
             "orphaned": orphaned}
    json.dump(modes[mode](), open(out, "w"), indent=2)
