"""Real runs of the code location, executed here: what `make demo` and `make next-day` launch.

`execute_in_process` runs carry no code-location origin (the UI lists them under no job), and a `dagster job
launch` per run starts a code server each time (too slow for ~50 runs). Here the workspace.yaml location is
loaded once; each run is created as the UI or the daemon would create it (job snapshot, execution plan, the
workspace's own origin: the job page lists it, re-execution shows no version warning), then executed
synchronously in this process with the in-process executor, as a run worker would.

Dagster has no public API for that (`execute_job` stamps no code-location origin; `DagsterInstance.submit_run`
goes through a run launcher: a process per run), nor for the schedules' and sensors' stored state, so this is
the one module of the repo that imports private Dagster names (tests/test_layout.py), written against
dagster==1.13.27 as pinned in pyproject.toml; tests/pipelines/test_code_location.py uses each of them, so an
upgrade that moves or changes one fails there.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import dagster as dg
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.execution.api import execute_run
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteInstigatorOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.remote_representation.code_location import InProcessCodeLocation
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorType,
    ScheduleInstigatorData,
    SensorInstigatorData,
)
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.workspace.load import location_origins_from_yaml_paths
from dagster._utils.hosted_user_process import recon_job_from_origin

from gem_model.config import REPO_ROOT
from gem_pipelines.run_launcher import reap_dead_runs

WORKSPACE_YAML = REPO_ROOT / "workspace.yaml"
IMPLICIT_ASSET_JOB = "__ASSET_JOB"
# Steps run in this process, one after another, as `execute_in_process` did: no process per step;
# the console shows warnings only (the UI shows every event of the run).
IN_PROCESS = {"execution": {"config": {"in_process": {}}},
              "loggers": {"console": {"config": {"log_level": "WARNING"}}}}


class CodeLocation:
    """The workspace's one code location, loaded once, launching synchronous runs on `instance`."""

    def __init__(self, instance: dg.DagsterInstance):
        # what `dagster dev` and the daemon load: runs are stamped with it
        (self.origin,) = location_origins_from_yaml_paths([str(WORKSPACE_YAML)])
        self.instance = instance
        self.location = InProcessCodeLocation(
            InProcessCodeLocationOrigin(self.origin.loadable_target_origin, location_name=self.origin.location_name),
            instance=instance,
        )
        (self.repo,) = self.location.get_repositories().values()
        self.repository_origin = RemoteRepositoryOrigin(self.origin, self.repo.name)
        reap_dead_runs(instance)  # a run that died with its machine holds no pool slot these runs wait for

    @property
    def name(self) -> str:
        return self.origin.location_name

    def create_run(self, job_name: str, *, partition_key: str | None = None, tags: dict[str, str] | None = None,
                   asset_selection: Iterable[dg.AssetKey] | None = None,
                   run_config: dict | None = None, parent: DagsterRun | None = None) -> DagsterRun:
        """A NOT_STARTED run of `job_name` (or of an asset subset of it), as the UI would create it; with `parent`,
        a re-execution of it (the lineage's root and parent run ids, as run fields and tags)."""
        selection = frozenset(asset_selection) if asset_selection else None
        selector = JobSubsetSelector(location_name=self.name, repository_name=self.repo.name, job_name=job_name,
                                     op_selection=None, asset_selection=selection)
        remote_job = self.location.get_job(selector)
        config = {**IN_PROCESS, **(run_config or {})}
        plan = self.location.get_execution_plan(remote_job, config, step_keys_to_execute=None, known_state=None,
                                                instance=self.instance)
        run_tags = {**remote_job.tags, **(tags or {})}
        if partition_key is not None:
            run_tags["dagster/partition"] = str(partition_key)
        root = (parent.root_run_id or parent.run_id) if parent else None
        if parent is not None:
            run_tags.update({"dagster/parent_run_id": parent.run_id, "dagster/root_run_id": root})
        return self.instance.create_run(
            job_name=job_name, run_id=None, run_config=config, resolved_op_selection=None, step_keys_to_execute=None,
            op_selection=None, status=None, root_run_id=root, parent_run_id=parent.run_id if parent else None,
            tags=run_tags, job_snapshot=remote_job.job_snapshot,
            execution_plan_snapshot=plan.execution_plan_snapshot, parent_job_snapshot=remote_job.parent_job_snapshot,
            remote_job_origin=RemoteJobOrigin(self.repository_origin, job_name),
            job_code_origin=remote_job.get_python_origin(), asset_selection=selection, asset_check_selection=None,
            asset_graph=self.repo.asset_graph,
        )

    def launch(self, job_name: str, *, tags: dict[str, str] | None = None, **kwargs) -> DagsterRun:
        """`create_run`, run here and now; returns the finished run (its status says whether it succeeded). If this
        process dies mid-run, the daemon marks the run failed but does not retry it (assets/retries.yaml `runs`):
        the command that ran it (`make demo`, `make next-day`) is the one to run again, not a stale run of it."""
        run = self.create_run(job_name, tags={**(tags or {}), "dagster/max_retries": "0"}, **kwargs)
        execute_run(recon_job_from_origin(run.job_code_origin), run, self.instance)  # type: ignore[arg-type]
        return self.instance.get_run_by_id(run.run_id)  # type: ignore[return-value]

    def reexecute(self, parent: DagsterRun) -> DagsterRun:
        """The UI's "Re-execute all" of `parent`, run here and now: its job, assets, partition, run config and own
        tags again, in its lineage."""
        own = {k: v for k, v in parent.tags.items() if not k.startswith("dagster/")}
        return self.launch(parent.job_name, partition_key=parent.tags.get("dagster/partition"), tags=own,
                           asset_selection=parent.asset_selection, run_config=dict(parent.run_config), parent=parent)

    def launch_request(self, request: dg.RunRequest, job_name: str | None = None) -> DagsterRun:
        """Execute what a schedule, a sensor or an automation evaluation asked for."""
        tags = dict(request.tags)
        if request.run_key:
            tags["dagster/run_key"] = request.run_key
        name = request.job_name or job_name or IMPLICIT_ASSET_JOB
        return self.launch(name, partition_key=request.partition_key, tags=tags,
                           asset_selection=request.asset_selection, run_config=dict(request.run_config or {}))

    # -- schedules and sensors: state as the UI's toggle would store it, under the workspace's origin

    def _instigator_origin(self, name: str) -> RemoteInstigatorOrigin:
        return RemoteInstigatorOrigin(self.repository_origin, name)

    def start_schedule(self, name: str) -> None:
        remote = self.repo.get_schedule(name)
        data = ScheduleInstigatorData(remote.cron_schedule, start_timestamp=dt.datetime.now(dt.UTC).timestamp())
        self._store(InstigatorState(self._instigator_origin(name), InstigatorType.SCHEDULE,
                                    InstigatorStatus.RUNNING, data), remote.selector_id)

    def start_sensor(self, name: str, cursor: str | None = None) -> None:
        remote = self.repo.get_sensor(name)
        data = SensorInstigatorData(cursor=cursor, sensor_type=remote.sensor_type,
                                    last_sensor_start_timestamp=dt.datetime.now(dt.UTC).timestamp())
        self._store(InstigatorState(self._instigator_origin(name), InstigatorType.SENSOR,
                                    InstigatorStatus.RUNNING, data), remote.selector_id)

    def _store(self, state: InstigatorState, selector_id: str) -> None:
        if self.instance.get_instigator_state(state.instigator_origin_id, selector_id) is None:
            self.instance.add_instigator_state(state)
        else:
            self.instance.update_instigator_state(state)

    def instigator_state(self, name: str) -> InstigatorState | None:
        """The stored state of a schedule or sensor (None: never switched on or off)."""
        remote = self.repo.get_sensor(name) if self.repo.has_sensor(name) else self.repo.get_schedule(name)
        return self.instance.get_instigator_state(self._instigator_origin(name).get_id(), remote.selector_id)

    def sensor_cursor(self, name: str) -> str | None:
        state = self.instigator_state(name)
        return state.instigator_data.cursor if state and state.instigator_data else None  # type: ignore[union-attr]

    def set_sensor_cursor(self, name: str, cursor: str | None) -> None:
        """Keep the cursor an evaluation of the sensor ended with, as a tick would (if the sensor has a state)."""
        state = self.instigator_state(name)
        if state is not None:
            self.instance.update_instigator_state(state.with_data(state.instigator_data._replace(cursor=cursor)))  # type: ignore[union-attr]


def status(location: CodeLocation) -> dict[str, object]:
    """What the UI would show: each job's current snapshot id, each schedule's and sensor's state and
    description, and what switching the landing sensor on would ingest now."""
    from gem_pipelines.sensors import landing_sensor

    instigators = {}
    for remote in [*location.repo.get_schedules(), *location.repo.get_sensors()]:
        state = location.instigator_state(remote.name)
        instigators[remote.name] = {
            "status": state.status.value if state else "DEFAULT",
            "description": remote.description,
            "cursor": getattr(state.instigator_data, "cursor", None) if state else None,
        }
    cursor = instigators[landing_sensor.name]["cursor"]
    result = landing_sensor(dg.build_sensor_context(instance=location.instance, cursor=cursor))
    return {
        "location": location.name,
        "repository_label": location.repository_origin.get_label(),
        "jobs": {job.name: job.computed_job_snapshot_id
                 for job in location.repo.get_all_jobs()},
        "instigators": instigators,
        "landing_sensor_would_request": [] if isinstance(result, dg.SkipReason) else [str(r.partition_key) for r in result],
    }


if __name__ == "__main__":
    import json

    from gem_pipelines.instance import get_instance

    print(json.dumps(status(CodeLocation(get_instance())), indent=2, default=str))
