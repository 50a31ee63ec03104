"""Catalog metadata on every asset: kinds, owners, code versions, and for lake tables the column
schema and the Delta table URI (assets/catalog.yaml holds the owners and kinds).

Applied once to the whole graph in definitions.py, so the asset modules stay about what they compute.
A code version is a hash of the module that defines the asset and the library code it calls, so the
UI marks a partition stale when that code changed since it was materialized.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import yaml

from gem_model.config import ASSETS_DIR, REPO_ROOT
from gem_model.store.paths import table_uri
from gem_model.store.schemas import (
    EVENTS_SCHEMA,
    ORACLE_SCHEMA,
    QUARANTINE_SCHEMA,
    TRAINING_EXAMPLES_SCHEMA,
    USER_ACTIVITY_SCHEMA,
)

# Library code behind each group: a change there changes the code version of its assets.
_LIBRARY = {
    "ingest": ["gem_pipelines/data", "gem_model/store/schemas.py"],
    "features": ["gem_pipelines/data/history.py", "gem_model/store/schemas.py"],
    "foundation": ["gem_model"],
    "students": ["gem_model"],
}


def lake_schemas() -> dict[str, dict[str, pl.DataType]]:
    from gem_model.distill import TEACHER_PREDICTIONS_SCHEMA

    return {"events": EVENTS_SCHEMA, "user_activity": USER_ACTIVITY_SCHEMA, "events_quarantine": QUARANTINE_SCHEMA,
            "oracle": ORACLE_SCHEMA, "training_examples": TRAINING_EXAMPLES_SCHEMA,
            "teacher_predictions": dict(TEACHER_PREDICTIONS_SCHEMA)}


def column_schema(schema: dict[str, pl.DataType]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, str(dtype)) for name, dtype in schema.items()])


def _hash_paths(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.relative_to(REPO_ROOT).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def code_version(module: str, group: str | None) -> str:
    files = [Path(sys.modules[module].__file__ or "")]
    for rel in _LIBRARY.get(group or "", []):
        p = REPO_ROOT / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return _hash_paths(f for f in files if f.is_file())


def annotate(assets: Sequence[dg.AssetsDefinition], catalog_path: Path | None = None) -> list[Any]:
    """The same assets with kinds, owners, code versions, column schemas and table URIs."""
    catalog = yaml.safe_load((catalog_path or ASSETS_DIR / "catalog.yaml").read_text())
    schemas = lake_schemas()
    out = []
    for a in assets:
        module = a.op.compute_fn.decorated_fn.__module__

        def spec_with(spec: dg.AssetSpec, module: str = module) -> dg.AssetSpec:
            name = spec.key.to_user_string()
            meta: dict[str, Any] = {}
            if name in schemas:
                meta = {"dagster/column_schema": column_schema(schemas[name]), "dagster/uri": table_uri(name),
                        "dagster/table_name": name}
            spec = spec.merge_attributes(metadata=meta, kinds=set(catalog["kinds"].get(name, [])),
                                         owners=list(catalog["owners"].get(spec.group_name or "", [])))
            return spec.replace_attributes(code_version=code_version(module, spec.group_name))

        out.extend(dg.map_asset_specs(spec_with, [a]))
    return out
