"""The Dagster instance under $GEM_HOME/dagster that `make demo` and `make ui` share."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from gem_model.store.atomic import write_text
from gem_model.store.paths import gem_home

# Concurrency pools: dagster.yaml caps every pool at 1 (the gpu pool: one training step per GPU);
# ingest is set wider here, since named limits live in the instance's storage, not its yaml.
POOL_LIMITS = {"gpu": 1, "ingest": 4}

DAGSTER_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    granularity: op
    default_limit: 1   # any pool without an explicit limit (e.g. gpu): one step at a time
"""


def dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or gem_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        write_text(cfg, DAGSTER_YAML)
    return home


def get_instance() -> dg.DagsterInstance:
    dagster_home()
    instance = dg.DagsterInstance.get()
    for pool, limit in POOL_LIMITS.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    return instance
