"""Dagster's local run launcher, able to tell the daemon's run monitoring that a run's worker is gone.

The code server marks a run failed when its worker process dies while the server lives. When the server dies too
(the machine restarted, `make ui` stopped mid-run), nothing does: the run stays STARTED for good, its steps and
checkpoints abandoned. With this launcher (the instance's dagster.yaml, gem_pipelines/instance.py) the monitoring
daemon finds such a run's worker gone, marks the run failed, and the run retries of assets/retries.yaml re-execute
it from its failure: its training steps resume their versions from their checkpoints.

Dagster has no public API for a worker health check: CheckRunHealthResult and WorkerStatus are private names,
pinned with dagster==1.13.27 and exercised by tests/pipelines/test_run_launcher.py (tests/test_layout.py).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

# a process that started this long after the run did is not its worker (its pid was reused)
_START_SLACK_S = 5.0


@functools.cache
def _boot_time() -> float:
    return next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))


def _process_start(pid: int) -> float | None:
    """Start time (epoch seconds) of `pid` from Linux's /proc; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command name (which may hold spaces)
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def worker_alive(pid: int, started_at: float) -> bool:
    """Whether the process `pid` exists and is the one that was running at `started_at` (not a reuse of its pid)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process holds the pid now
        return False
    if not Path("/proc/stat").is_file():  # no /proc (macOS): existence is all there is to go on
        return True
    start = _process_start(pid)
    return start is not None and start <= started_at + _START_SLACK_S


class WatchedRunLauncher(dg.DefaultRunLauncher):
    """DefaultRunLauncher plus a worker health check: a run is alive while the process that started it (its
    RUN_START event) or one that started a step of it (STEP_START: the multiprocess executor's children, which
    outlive a killed parent) lives, on this machine, where the local launcher runs them."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        started = self._instance.get_records_for_run(
            run.run_id, of_type={dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_START}).records
        procs = [(e.dagster_event.pid, e.timestamp) for e in (r.event_log_entry for r in started)
                 if e.dagster_event is not None and e.dagster_event.pid is not None]
        if not procs:  # the monitor fails any status but RUNNING: no evidence, no verdict
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no process has started it yet")
        if any(worker_alive(pid, at) for pid, at in procs):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"its worker (pid {procs[0][0]}) is gone, its steps' too: the "
                                    "machine restarted, `make ui` stopped or they were killed while the run was in progress")


def reap_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """What the daemon's run monitoring does, for a process that runs without one (`make demo`, `make next-day`):
    a STARTED run whose worker is gone is marked failed, and the pool slots of runs that ended are freed, or a dead
    training run's `gpu` slot would hold this process's training steps for good. Returns the runs marked failed."""
    launcher = instance.run_launcher
    if not isinstance(launcher, WatchedRunLauncher):
        return []
    failed = []
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        health = launcher.check_run_worker_health(run)
        if health.status == WorkerStatus.FAILED:
            instance.report_run_failed(run, f"Marked failed: {health.msg}")
            failed.append(run.run_id)
    holding = instance.event_log_storage.get_concurrency_run_ids()
    for run in instance.get_runs(dg.RunsFilter(run_ids=list(holding))) if holding else []:
        if run.is_finished:
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    return failed
