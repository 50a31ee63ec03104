"""A training run (the foundation, a domain model) that died midway resumes from its last checkpoint: a failed step
retried by its retry policy (assets/retries.yaml), a failed run re-executed from the UI (the same version, its
finished steps kept), and only then: a new run trains a version of its own. The deaths: a failure raised after a
checkpoint (`fail_at_step`), and the training process SIGKILLed there (`fail_with: sigkill`) under the
multiprocess executor `make ui` runs. What resumes reads the lineage and the gate record, not how the run ended."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gem_model.config import REPO_ROOT

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("resume_driver.py")


def _failing(demo_copy: dict[str, str], tmp_path: Path, retries: dict, fail_with: str = "raise",
             runs: dict | None = None) -> dict[str, str]:
    """The environment of a copy of the demo world whose tiny presets (the foundation's, the domain models' and the
    students') die right after their step-2 checkpoint, with these step (and run) retries (assets/retries.yaml)."""
    assets = Path(shutil.copytree(demo_copy["GEM_ASSETS_DIR"], tmp_path / "assets"))
    tiny = yaml.safe_load((assets / "models" / "tiny.yaml").read_text())
    tiny["train"].update(checkpoint_every=1, fail_at_step=2, fail_with=fail_with)
    (assets / "models" / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    students = yaml.safe_load((assets / "models" / "students.yaml").read_text())
    students["presets"]["tiny"]["domain"].update(checkpoint_every=1, fail_at_step=2)
    students["presets"]["tiny"]["train"].update(checkpoint_every=1, fail_at_step=2)
    (assets / "models" / "students.yaml").write_text(yaml.safe_dump(students))
    (assets / "retries.yaml").write_text(yaml.safe_dump({"training": retries, **({"runs": runs} if runs else {})}))
    return {**demo_copy, "GEM_ASSETS_DIR": str(assets)}


def _drive(mode: str, env: dict[str, str], tmp_path: Path, returncode: int = 0, new_session: bool = False) -> dict:
    """resume_driver.py `mode` in `env` (in a process group of its own: `fail_with: sigkill_group` kills that), its
    JSON."""
    out = tmp_path / f"{mode}.json"
    proc = subprocess.run([sys.executable, str(DRIVER), mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=1000, start_new_session=new_session)
    assert proc.returncode == returncode, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(1200)
def test_a_run_that_died_in_training_resumes_from_its_checkpoint_when_re_executed(demo_copy: dict[str, str],
                                                                                  tmp_path: Path) -> None:
    doc = _drive("reexecute", _failing(demo_copy, tmp_path, {"max_retries": 0}), tmp_path)  # the failure fails its run
    failed, again, fresh = doc["runs"]
    assert [r["status"] for r in doc["runs"]] == ["FAILURE", "SUCCESS", "FAILURE"]
    # the re-execution is in the failed run's lineage, as the UI creates it; the new run starts one of its own
    assert again["root_run_id"] == again["parent_run_id"] == failed["run_id"] and again["trigger"] == "ui"
    assert fresh["root_run_id"] is None
    # the failed run left one version, unjudged, with its checkpoint; the re-execution finished that same version
    # from step 2, gated and ACCEPTED it, and materialized the asset
    (resumed,) = doc["after_failure"]
    assert doc["versions"][resumed] == {"resumed_from_step": 2, "step": doc["versions"][resumed]["step"],
                                        "gated": True, "checkpoint": True}
    assert doc["versions"][resumed]["step"] > 2
    assert doc["accepted"] == resumed
    assert doc["materialized_by"][0] == again["run_id"] and doc["resumed_shown"] == 2  # the UI says it resumed
    # the new run did not touch it: it trained (and lost) a version of its own, left unjudged
    (other,) = set(doc["versions"]) - {resumed}
    assert doc["versions"][other] == {"resumed_from_step": None, "step": None, "gated": False, "checkpoint": True}
    # a domain model: failed after step 2, re-executed, the same version finished from step 2, gated, ACCEPTED
    domain = doc["domain"]
    assert [r["status"] for r in domain["runs"]] == ["FAILURE", "SUCCESS"]
    assert domain["runs"][1]["root_run_id"] == domain["runs"][0]["run_id"]
    (version,) = domain["after_failure"]
    assert set(domain["versions"]) == {version} and domain["accepted"] == version
    assert domain["versions"][version]["resumed_from_step"] == 2 and domain["versions"][version]["step"] > 2
    assert domain["versions"][version]["gated"] and not domain["versions"][version]["checkpoint"]  # judged: dropped
    assert domain["resumed_shown"] == 2


@pytest.mark.timeout(1200)
def test_a_training_step_killed_or_failed_midway_is_retried_and_resumes(demo_copy: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """As `make ui` runs a job, each step in a child process: the teacher's training process SIGKILLed right after
    its step-2 checkpoint (the OOM killer's way: no exception, no clean-up), a student's training failing there, are
    retried in the same run and continue their version from step 2."""
    doc = _drive("retry", _failing(demo_copy, tmp_path, {"max_retries": 1, "delay_s": 1}, fail_with="sigkill"), tmp_path)
    assert doc["status"] == "SUCCESS" and doc["new_runs"] == 1 and doc["step_failures"] == 0
    (retry,) = doc["retries"]
    assert retry["step"] == "foundation_model" and "ChildProcessCrash" in retry["error"], retry  # no exception: a crash
    (version,) = doc["versions"]
    assert doc["versions"][version]["resumed_from_step"] == 2 and doc["versions"][version]["step"] > 2
    assert doc["versions"][version]["gated"] and doc["accepted"] == version and doc["resumed_shown"] == 2
    # the production student of a surface, failing after its step-2 checkpoint: retried, resumed from step 2, gated,
    # its checkpoint gone once judged
    student = doc["student"]
    assert student["status"] == "SUCCESS" and student["new_runs"] == 1 and len(student["retries"]) == 1
    assert student["retries"][0]["step"] == "students" and "simulated failure at step 2" in student["retries"][0]["error"]
    assert student["resumed_from_step"] == student["resumed_shown"] == 2
    assert student["gated"] and student["checkpoints_left"] == []


@contextlib.contextmanager
def _daemon(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """`dagster-daemon run` on the workspace, as `make ui` starts it, in a process group of its own (its code server
    and run workers with it), stopped with everything it started; its output appended to `log`."""
    with log.open("a") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"],
                                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def _until(what: Callable[[], object], timeout: float, why: str, log: Path) -> object:
    end = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < end, f"{why}; the daemon's log ends:\n{log.read_text()[-6000:]}"
        time.sleep(1)
    return found


@pytest.mark.timeout(1200)
def test_a_run_whose_worker_died_unnoticed_is_found_and_retried_if_the_daemon_launched_it(demo_copy: dict[str, str],
                                                                                          tmp_path: Path) -> None:
    """The machine restarts while a training run of the UI is in progress: its worker, the code server and the daemon
    die together, nothing is left to say the run ended, and it stays STARTED, holding the gpu pool's slot. `make demo`
    then finds its worker gone (the run launcher's health check), marks it failed and frees the slot its own training
    waits for; it is killed the same way. Once the daemon runs again (`make ui`), the UI's run is re-executed from
    its failure (assets/retries.yaml `runs`) and the foundation's training resumes its version from the step-2
    checkpoint, ACCEPTED; the demo's run is marked failed by the daemon, not retried: the command is the one to run
    again, not a stale run of it."""
    env = _failing(demo_copy, tmp_path, {"max_retries": 0}, fail_with="sigkill_group",
                   runs={"max_retries": 1, "check_every_s": 2})
    subprocess.run([sys.executable, "-c", "from gem_pipelines.instance import dagster_home; dagster_home()"], env=env,
                   check=True)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    failures_seen = f"EVENT_LOG_CONSUMER_CURSOR-{dg.DagsterEventType.RUN_FAILURE.value}"
    log = tmp_path / "daemon.log"
    with _daemon(env, log) as daemon:  # `make ui` ran on this instance before: its retries read failures from then on
        _until(lambda: instance.daemon_cursor_storage.get_cursor_values({failures_seen}), 300, "no retry daemon", log)
        submitted = _drive("submit", env, tmp_path)
        # the daemon launches it; after its step-2 checkpoint the training kills the daemon's whole process group
        _until(lambda: daemon.poll() is not None, 600, "the run's training did not take its daemon down", log)
    ui_run = instance.get_run_by_id(submitted["run_id"])
    assert ui_run is not None and ui_run.status == dg.DagsterRunStatus.STARTED  # nobody left to say it ended
    known_runs = set(_drive("orphan", env, tmp_path, returncode=-signal.SIGKILL, new_session=True)["known_runs"])
    (demo_run,) = [r for r in instance.get_runs(dg.RunsFilter(job_name="foundation_job")) if r.run_id not in known_runs]
    assert demo_run.status == dg.DagsterRunStatus.STARTED
    assert instance.get_run_by_id(ui_run.run_id).status == dg.DagsterRunStatus.FAILURE  # the demo found it dead
    with _daemon(env, log):
        _until(lambda: instance.get_runs(dg.RunsFilter(tags={"dagster/root_run_id": ui_run.run_id},
                                                       statuses=[dg.DagsterRunStatus.SUCCESS,
                                                                 dg.DagsterRunStatus.FAILURE])), 300, "no retry ended", log)
        _until(lambda: instance.get_run_by_id(demo_run.run_id).status == dg.DagsterRunStatus.FAILURE, 60,
               "the demo's run is not marked failed", log)
        time.sleep(10)  # five more rounds of the run retries: none for the demo's run
    doc = _drive("orphaned", env, tmp_path)
    runs = {r["run_id"]: r for r in doc["runs"]}
    ui, demo = runs[ui_run.run_id], runs[demo_run.run_id]
    (retried,) = [r for r in doc["runs"] if r["root_run_id"] == ui_run.run_id]
    for failed in (ui, demo):  # the launcher's health check said why
        assert failed["status"] == "FAILURE" and len(failed["failure"]) == 1 and "is gone" in failed["failure"][0]
    assert retried["status"] == "SUCCESS" and retried["parent_run_id"] == ui_run.run_id
    assert retried["retry_number"] == "1" and retried["executor"] == "in_process"  # the run's own config again
    assert not [r for r in doc["runs"] if r["root_run_id"] == demo_run.run_id]  # the demo's run: not retried
    # the retry continued the UI run's version from step 2, gated, ACCEPTED; the demo's run left its own unjudged
    resumed, left = sorted(set(doc["versions"]) - set(submitted["known"]),
                           key=lambda v: doc["versions"][v]["resumed_from_step"] is None)
    assert doc["versions"][resumed]["resumed_from_step"] == 2 and doc["versions"][resumed]["step"] > 2
    assert doc["versions"][resumed]["gated"] and doc["accepted"] == resumed and doc["resumed_shown"] == 2
    assert doc["versions"][left] == {"resumed_from_step": None, "step": None, "gated": False, "checkpoint": True}
