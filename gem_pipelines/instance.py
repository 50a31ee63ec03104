"""The Dagster instance under $GEM_HOME/dagster that `make demo` and `make ui` share."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from gem_model.store.atomic import write_text
from gem_model.store.paths import gem_home
from gem_pipelines.settings import RETRIES

# Concurrency pools: dagster.yaml caps every pool at 1 (the gpu pool: one training step per GPU);
# ingest is set wider here, since named limits live in the instance's storage, not its yaml.
POOL_LIMITS = {"gpu": 1, "ingest": 4}

MARK = "# Written by gem_pipelines.instance"
# the pools, as an earlier release wrote them alone: such a file is still the project's, brought up to date
POOLS = """\
telemetry:
  enabled: false
concurrency:
  pools:
    granularity: op
    default_limit: 1   # any pool without an explicit limit (e.g. gpu): one step at a time
"""


def dagster_yaml() -> str:
    """The instance's settings; the run retries from assets/retries.yaml (gem_pipelines.run_launcher says why)."""
    runs = RETRIES.runs
    return f"""\
{MARK} from assets/retries.yaml: edits here are replaced (remove this line to keep your own).
{POOLS}run_launcher:          # the local launcher, with a health check of each run's worker
  module: gem_pipelines.run_launcher
  class: WatchedRunLauncher
run_monitoring:        # a run whose worker is gone is marked failed, and the pool slots its steps held are freed
  enabled: true        # (a killed training step's gpu slot would hold every later training run in the queue)
  poll_interval_seconds: {runs.check_every_s}
  free_slots_after_run_end_seconds: {runs.check_every_s}
run_retries:           # runs whose worker died; a step's failure had the step's own retries
  enabled: {str(runs.max_retries > 0).lower()}
  max_retries: {runs.max_retries}
  retry_on_asset_or_op_failure: false
"""


def dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or gem_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    cfg = home / "dagster.yaml"
    current, wanted = cfg.read_text() if cfg.exists() else None, dagster_yaml()
    # ours (written by an earlier release, or from other settings) follows the settings; a user's own stays
    if current != wanted and (current is None or current == POOLS or current.startswith(MARK)):
        write_text(cfg, wanted)
    return home


def get_instance() -> dg.DagsterInstance:
    dagster_home()
    instance = dg.DagsterInstance.get()
    for pool, limit in POOL_LIMITS.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    return instance
