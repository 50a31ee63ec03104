"""Which asset partitions are older than an input they read, and a mark on each in the UI.

The automation rebuilds what follows new data at once; what waits on purpose (the foundation model
on its weekly cadence, the domain models on their teacher) would otherwise keep looking current
after an upstream partition is re-ingested. `mark_stale` records an observation on each such
partition, naming the newer inputs, so the asset's page says it is stale and why.
"""

from __future__ import annotations

import dagster as dg

STALE_KEY = "stale"


def latest_materializations(instance: dg.DagsterInstance, graph) -> dict[tuple[dg.AssetKey, str | None], int]:
    """(asset, partition) -> storage id of its latest materialization; never-materialized ones absent."""
    out = {}
    for key in graph.materializable_asset_keys:
        pdef = graph.get(key).partitions_def
        for pk in [str(k) for k in pdef.get_partition_keys(dynamic_partitions_store=instance)] if pdef else [None]:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk] if pk else None), limit=1).records
            if records:
                out[(key, pk)] = records[0].storage_id
    return out


def _parent_partitions(graph, child: dg.AssetKey, pk: str | None, parent: dg.AssetKey) -> list[str | None]:
    parent_pdef, child_pdef = graph.get(parent).partitions_def, graph.get(child).partitions_def
    if parent_pdef is None:
        return [None]
    mapping = graph.get_partition_mapping(child, parent)
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        child_pdef.subset_with_partition_keys([pk]) if child_pdef is not None and pk is not None else None,
        child_pdef, parent_pdef)
    return [str(k) for k in result.partitions_subset.get_partition_keys()]


def stale_partitions(instance: dg.DagsterInstance, graph) -> dict[str, list[str]]:
    """'asset[partition]' -> the inputs ('parent[partition]') materialized after it, for every
    materialized asset partition that has any (`graph`: the code location's asset graph)."""
    latest = latest_materializations(instance, graph)
    stale: dict[str, list[str]] = {}
    for (key, pk), storage_id in sorted(latest.items(), key=lambda kv: (kv[0][0].to_user_string(), kv[0][1] or "")):
        newer = [
            f"{parent.to_user_string()}[{ppk or ''}]"
            for parent in sorted(graph.get(key).parent_keys, key=lambda k: k.to_user_string())
            if parent in graph.materializable_asset_keys
            for ppk in _parent_partitions(graph, key, pk, parent)
            if latest.get((parent, ppk), -1) > storage_id
        ]
        if newer:
            stale[f"{key.to_user_string()}[{pk or ''}]"] = newer
    return stale


def _split(name: str) -> tuple[str, str | None]:
    asset, pk = name[:-1].split("[", 1)
    return asset, pk or None


def marked_inputs(instance: dg.DagsterInstance, name: str) -> list[str] | None:
    """The newer inputs the latest observation of 'asset[partition]' names, if it is a stale mark."""
    asset, pk = _split(name)
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[pk] if pk else None), limit=1).records
    meta = records[0].asset_observation.metadata if records and records[0].asset_observation else {}
    return meta["newer_inputs"].value if STALE_KEY in meta else None  # type: ignore[return-value]


def stale_marks(instance: dg.DagsterInstance, graph) -> tuple[dict[str, list[str]], list[dg.AssetObservation]]:
    """Every stale asset partition, and an observation for each one not yet marked with the same inputs."""
    stale = stale_partitions(instance, graph)
    marks = []
    for name, newer in stale.items():
        if marked_inputs(instance, name) == newer:
            continue  # already says so
        asset, pk = _split(name)
        shown = ", ".join(newer[:6]) + (f" and {len(newer) - 6} more" if len(newer) > 6 else "")
        marks.append(dg.AssetObservation(
            asset, partition=pk, description=f"stale: built before {shown} changed",
            metadata={STALE_KEY: True, "newer_inputs": dg.MetadataValue.json(newer)}))
    return stale, marks


def mark_stale(instance: dg.DagsterInstance, graph) -> dict[str, list[str]]:
    """Record the stale marks (`stale_marks`) in the instance; returns every stale partition."""
    stale, marks = stale_marks(instance, graph)
    for mark in marks:
        instance.report_runless_asset_event(mark)
    return stale
