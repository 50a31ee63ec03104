"""Kill a foundation_model run in training, re-execute it as the UI's "Re-execute" does, then start a new run; kill
and re-execute a domain_models run; write what happened as JSON: each run's status and lineage, the versions on
disk, ACCEPTED and the resumed step.

Run as a script by tests/pipelines/test_resume_training.py on a copy of the demo world whose tiny presets (the
foundation's and the domain models') fail at step 2, after that step's checkpoint (`train.fail_at_step`; the calendar and presets come from GEM_ASSETS_DIR, read
at import, hence a fresh process): `python resume_driver.py <out.json>`."""

from __future__ import annotations

import json
import sys

import dagster as dg

from gem_model.models.registry import list_versions, read_accepted
from gem_model.store.paths import models_dir
from gem_pipelines.code_location import CodeLocation
from gem_pipelines.instance import get_instance

# a cold teacher alone: the failure hits it, not a baseline after it
CONFIG = {"ops": {"foundation_model": {"config": {"baselines": False, "warm_start": False}}}}


def main(out: str) -> None:
    location = CodeLocation(get_instance())
    known = set(list_versions("foundation_model"))
    runs = []
    first = location.launch("foundation_job", run_config=CONFIG, tags={"gem/trigger": "ui"})
    runs.append(first)
    after_kill = sorted(set(list_versions("foundation_model")) - known)
    runs.append(location.reexecute(first))
    runs.append(location.launch("foundation_job", run_config=CONFIG, tags={"gem/trigger": "ui"}))
    versions = sorted(set(list_versions("foundation_model")) - known)
    # a domain model killed the same way, then re-executed
    known_domain = set(list_versions("domain_models", "commerce"))
    domain_runs = [location.launch("domain_models_job", partition_key="commerce", tags={"gem/trigger": "ui"})]
    domain_after_kill = sorted(set(list_versions("domain_models", "commerce")) - known_domain)
    domain_runs.append(location.reexecute(domain_runs[0]))

    def metrics(v: str, partition: str | None = None) -> dict:
        path = models_dir(asset(partition), partition) / v / "metrics.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def asset(partition: str | None) -> str:
        return "domain_models" if partition else "foundation_model"

    json.dump({
        "runs": [{"run_id": r.run_id, "status": r.status.value, "root_run_id": r.root_run_id,
                  "parent_run_id": r.parent_run_id, "trigger": r.tags.get("gem/trigger")} for r in runs],
        "after_kill": after_kill,
        "versions": {v: {"resumed_from_step": metrics(v).get("resumed_from_step"), "step": metrics(v).get("step"),
                         "gated": (models_dir("foundation_model") / v / "gate.json").is_file(),
                         "checkpoint": (models_dir("foundation_model") / v / "checkpoint.pt").is_file()}
                     for v in versions},
        "accepted": getattr(read_accepted("foundation_model"), "name", None),
        "materialized_by": [e.run_id for e in get_instance().fetch_materializations(
            dg.AssetKey("foundation_model"), limit=10).records],
        "domain": {
            "runs": [{"run_id": r.run_id, "status": r.status.value, "root_run_id": r.root_run_id} for r in domain_runs],
            "after_kill": domain_after_kill,
            "versions": {v: {"resumed_from_step": metrics(v, "commerce").get("resumed_from_step"),
                             "steps": metrics(v, "commerce").get("steps"),
                             "gated": (models_dir("domain_models", "commerce") / v / "gate.json").is_file(),
                             "checkpoint": (models_dir("domain_models", "commerce") / v / "checkpoint.pt").is_file()}
                         for v in sorted(set(list_versions("domain_models", "commerce")) - known_domain)},
            "accepted": getattr(read_accepted("domain_models", "commerce"), "name", None),
        },
    }, open(out, "w"), indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
