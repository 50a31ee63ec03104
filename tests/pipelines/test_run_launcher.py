"""The instance `make ui` runs on: its dagster.yaml (written from assets/retries.yaml, kept when it is the user's),
and the run launcher's health check of a run's worker (the daemon's run monitoring reads it). The daemon acting on
it: tests/pipelines/test_resume_training.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.launcher import WorkerStatus

from gem_pipelines import instance as gem_instance
from gem_pipelines.run_launcher import WatchedRunLauncher, reap_dead_runs, worker_alive

MATERIALIZE = textwrap.dedent("""
    import dagster as dg

    @dg.asset
    def one() -> int:
        return 1

    dg.materialize([one], instance=dg.DagsterInstance.get())
""")
# a training step killed with its process, holding the gpu pool's slot (the run stays STARTED: nobody says it ended)
DIES = textwrap.dedent("""
    import os, signal
    import dagster as dg

    @dg.asset(pool="gpu")
    def trains() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    dg.materialize([trains], instance=dg.DagsterInstance.get())
""")


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    return gem_instance.dagster_home()


def test_the_instance_yaml_says_how_runs_are_watched_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_launcher, WatchedRunLauncher)
        assert instance.run_monitoring_enabled and instance.run_retries_enabled
        # the slots a dead run's steps held are freed (else its gpu slot holds every later training run queued)
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] > 0
        assert instance.run_retries_max_retries == gem_instance.RETRIES.runs.max_retries >= 1
        assert not instance.run_retries_retry_on_asset_or_op_failure  # a step's failure had the step's retries
        assert instance.run_launcher.supports_check_run_worker_health


def test_the_instance_yaml_follows_the_settings_unless_it_is_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg = _home(tmp_path, monkeypatch) / "dagster.yaml"
    ours = cfg.read_text()
    outdated = ours.replace(f"max_retries: {gem_instance.RETRIES.runs.max_retries}", "max_retries: 7")
    assert outdated != ours
    cfg.write_text(outdated)  # ours, outdated: rewritten
    gem_instance.dagster_home()
    assert cfg.read_text() == gem_instance.dagster_yaml()
    cfg.write_text(gem_instance.POOLS)  # what an earlier release wrote: brought up to date
    gem_instance.dagster_home()
    assert cfg.read_text() == gem_instance.dagster_yaml()
    own = "telemetry:\n  enabled: true\n"  # no marker line: the user's, kept
    cfg.write_text(own)
    gem_instance.dagster_home()
    assert cfg.read_text() == own


def test_a_worker_is_alive_while_its_process_is():
    assert worker_alive(os.getpid(), time.time())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    assert not worker_alive(int(gone.stdout), time.time())


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="no /proc: a reused pid is not told apart")
def test_a_process_that_started_after_the_run_is_not_its_worker():
    assert not worker_alive(os.getpid(), started_at=time.time() - 10 * 86400)  # the pid, reused since


def test_the_health_check_reads_the_process_that_started_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = _home(tmp_path, monkeypatch)
    subprocess.run([sys.executable, "-c", MATERIALIZE], env={**os.environ, "DAGSTER_HOME": str(home)}, check=True,
                   capture_output=True)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (elsewhere,) = instance.get_runs()

        @dg.asset
        def here() -> int:
            return 1

        assert dg.materialize([here], instance=instance).success
        (mine,) = [r for r in instance.get_runs() if r.run_id != elsewhere.run_id]
        check = instance.run_launcher.check_run_worker_health
        assert check(mine).status == WorkerStatus.RUNNING  # this process: alive
        gone = check(elsewhere)
        assert gone.status == WorkerStatus.FAILED and "is gone" in gone.msg  # the subprocess that ran it exited
        job = dg.Definitions(assets=[here], jobs=[dg.define_asset_job("j", [here])]).resolve_job_def("j")
        not_started = instance.create_run_for_job(job)
        assert check(not_started).status == WorkerStatus.RUNNING  # no RUN_START yet: no verdict


def test_a_process_without_the_daemon_reaps_the_runs_whose_worker_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`make demo` after a machine restart: the dead run is marked failed and its gpu slot freed, or the demo's
    training steps would wait for that slot for good."""
    home = _home(tmp_path, monkeypatch)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.event_log_storage.set_concurrency_slots("gpu", 1)
    died = subprocess.run([sys.executable, "-c", DIES], env={**os.environ, "DAGSTER_HOME": str(home)},
                          capture_output=True)
    assert died.returncode == -9
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (dead,) = instance.get_runs()
        assert dead.status == dg.DagsterRunStatus.STARTED
        assert [c.run_id for c in instance.event_log_storage.get_concurrency_info("gpu").claimed_slots] == [dead.run_id]
        assert reap_dead_runs(instance) == [dead.run_id]
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.event_log_storage.get_concurrency_info("gpu").claimed_slots == []
        assert reap_dead_runs(instance) == []  # once



SLOW_JOB = textwrap.dedent("""
    import time
    import dagster as dg

    @dg.asset
    def slow() -> None:
        time.sleep(300)

    defs = dg.Definitions(assets=[slow], jobs=[dg.define_asset_job("slow_job", [slow], executor_def=dg.multiprocess_executor)])
""")


def test_a_run_lives_while_a_step_process_outlives_its_killed_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The multiprocess executor's step processes outlive a killed run worker, and still write the run's events: not
    dead (a retry beside them would train the same version twice) until they are gone too."""
    home = _home(tmp_path, monkeypatch)
    (tmp_path / "slow.py").write_text(SLOW_JOB)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []  # the storage's tables exist before the CLI opens them too (a race otherwise)
    cli = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "job", "execute", "-f",
                            str(tmp_path / "slow.py"), "-j", "slow_job"], env={**os.environ, "DAGSTER_HOME": str(home)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            end = time.monotonic() + 120
            while not (runs := instance.get_runs()) or not instance.get_records_for_run(
                    runs[0].run_id, of_type=dg.DagsterEventType.STEP_START).records:
                assert time.monotonic() < end and cli.poll() is None, "the step did not start"
                time.sleep(0.5)
            (run,) = runs
            step_pid = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_START).records[0] \
                .event_log_entry.dagster_event.pid
            assert step_pid != cli.pid
            check = instance.run_launcher.check_run_worker_health
            assert check(run).status == WorkerStatus.RUNNING
            cli.kill()  # the run worker alone
            cli.wait(timeout=30)
            assert check(run).status == WorkerStatus.RUNNING  # its step's process lives on
            os.kill(step_pid, 9)
            end = time.monotonic() + 30
            while check(run).status != WorkerStatus.FAILED:
                assert time.monotonic() < end, "the step's process did not go"
                time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of its group is left
            os.killpg(cli.pid, 9)
