"""Re-ingest one date x surface partition the way the UI's "Materialize" does (a run of the ingest
assets through the instance), then let the automation do what `make next-day` does after a landing
(`gem_pipelines.next_day.run_automation`), and write what happened as JSON: each asset partition's
latest materialization before and after, every run since the re-ingest (job, status) and the backfills.

Run as a script by tests/pipelines/test_reingest.py (the calendar comes from GEM_ASSETS_DIR, read at
import, hence a fresh process): `python reingest_driver.py <date>|<surface> <out.json>`."""

from __future__ import annotations

import json
import sys

import dagster as dg

from gem_pipelines.code_location import IMPLICIT_ASSET_JOB, CodeLocation
from gem_pipelines.instance import get_instance
from gem_pipelines.next_day import _Launcher, run_automation

INGEST = [dg.AssetKey(k) for k in ("events", "user_activity", "events_quarantine")]


def latest(instance: dg.DagsterInstance, defs: dg.Definitions) -> dict[str, int]:
    """'asset[partition]' -> storage id of its latest materialization (absent: never materialized)."""
    out = {}
    graph = defs.resolve_asset_graph()
    for key in graph.materializable_asset_keys:
        pdef = graph.get(key).partitions_def
        for pk in pdef.get_partition_keys() if pdef else [None]:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk] if pk else None), limit=1).records
            if records:
                out[f"{key.to_user_string()}[{pk or ''}]"] = records[0].storage_id
    return out


def main(partition: str, out: str) -> None:
    from gem_pipelines.definitions import defs

    instance = get_instance()
    location = CodeLocation(instance)
    before = latest(instance, defs)
    known_runs = {r.run_id for r in instance.get_runs()}
    # the UI's "Materialize" on an events partition: the ingest multi-asset, in the implicit asset job
    ui = location.launch(IMPLICIT_ASSET_JOB, partition_key=partition, asset_selection=INGEST,
                         tags={"gem/trigger": "ui"})
    launch = _Launcher(location)
    summary = run_automation(location, 6, launch)
    runs = [r for r in instance.get_runs() if r.run_id not in known_runs]
    json.dump({
        "reingest": {"run_id": ui.run_id, "status": ui.status.value},
        "summary": {**summary, "failed": launch.failed},
        "before": before,
        "after": latest(instance, defs),
        "runs": [{"job_name": r.job_name, "status": r.status.value, "partition": r.tags.get("dagster/partition"),
                  "trigger": r.tags.get("gem/trigger"),
                  "assets": sorted(k.to_user_string() for k in r.asset_selection or [])} for r in runs],
        "backfills": [{"id": b.backfill_id, "status": b.status.value} for b in instance.get_backfills()],
        "stale_marks": {name: _stale_mark(instance, name) for name in summary["stale"]},
    }, open(out, "w"), indent=2)


def _stale_mark(instance: dg.DagsterInstance, name: str) -> list[str] | None:
    """The newer inputs the latest observation of 'asset[partition]' names (None: not marked stale)."""
    from gem_pipelines.staleness import marked_inputs

    return marked_inputs(instance, name)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
