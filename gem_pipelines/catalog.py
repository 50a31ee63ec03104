"""Catalog metadata on every asset: kinds, owners, code versions, and for lake tables the column
schema and the Delta table URI (assets/catalog.yaml holds the owners and kinds).

Applied once to the whole graph in definitions.py, so the asset modules stay about what they compute.
A code version is a hash of the module that defines the asset, the library code it calls and the specs
in assets/ it reads, so the UI marks a partition stale when any of them changed since it was materialized.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from gem_model.config import (
    ASSETS_DIR,
    REPO_ROOT,
    ConfigError,
    _load,
    _Strict,
    dataset_name,
    env,
    load_features,
    simulator_path,
    validate_name,
)
from gem_model.store.paths import table_uri
from gem_model.store.schemas import (
    ORACLE_SCHEMA,
    QUARANTINE_SCHEMA,
    USER_ACTIVITY_SCHEMA,
    events_schema,
    training_examples_schema,
)

# Library code behind each group: a change there changes the code version of its assets.
_LIBRARY = {
    "ingest": ["gem_pipelines/data", "gem_model/store/schemas.py"],
    "features": ["gem_pipelines/data/history.py", "gem_pipelines/data/counters.py", "gem_model/store/schemas.py"],
    "foundation": ["gem_model"],
    "students": ["gem_model"],
}
# The specs in assets/ each group reads, so a config change is a new version as a code change is.
# "{preset}" is GEM_MODEL_PRESET; "{simulator}" the world of GEM_SIMULATOR. A GEM_DATA dataset's own copy
# (assets/sources/<name>/<same path>) counts too: the loaders layer it on, or use it instead of, the shared one.
_CONFIG = {
    "ingest": ["surfaces.yaml", "{simulator}", "expectations", "quality.yaml"],
    "features": ["features.yaml"],
    "foundation": ["calendar.yaml", "surfaces.yaml", "features.yaml", "quality.yaml", "models/{preset}.yaml"],
    "students": ["calendar.yaml", "surfaces.yaml", "features.yaml", "quality.yaml", "models/students.yaml"],
}


class CatalogConfig(_Strict):
    """assets/catalog.yaml: Dagster owners per asset group, kinds per asset."""

    owners: dict[str, tuple[str, ...]]
    kinds: dict[str, tuple[str, ...]]


def load_catalog(path: Path | None = None) -> CatalogConfig:
    return _load(CatalogConfig, path or ASSETS_DIR / "catalog.yaml")


def lake_schemas() -> dict[str, dict[str, pl.DataType]]:
    from gem_model.distill import TEACHER_PREDICTIONS_SCHEMA

    context = load_features().context  # the dataset's own log columns follow the unified schema
    return {"events": events_schema(context), "user_activity": USER_ACTIVITY_SCHEMA, "events_quarantine": QUARANTINE_SCHEMA,
            "oracle": ORACLE_SCHEMA, "training_examples": training_examples_schema(context),
            "teacher_predictions": dict(TEACHER_PREDICTIONS_SCHEMA)}


def column_schema(schema: dict[str, pl.DataType]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, str(dtype)) for name, dtype in schema.items()])


def _files(path: Path, pattern: str) -> list[Path]:
    return sorted(path.rglob(pattern)) if path.is_dir() else [path]


def config_files(group: str | None, assets_dir: Path = ASSETS_DIR) -> list[Path]:
    """The spec files of assets/ behind `group` that exist (shared ones, then the GEM_DATA dataset's)."""
    preset = validate_name(str(env("GEM_MODEL_PRESET")), "GEM_MODEL_PRESET", ConfigError)
    rels = [r.format(preset=preset, simulator=simulator_path().name)
            for r in _CONFIG.get(group or "", [])]
    roots = [assets_dir]
    if (name := dataset_name()) != "sim":
        roots.append(assets_dir / "sources" / name)
    return [f for root in roots for rel in rels for f in _files(root / rel, "*.json") if f.is_file()]


def code_version(module: str, group: str | None, assets_dir: Path = ASSETS_DIR) -> str:
    """Hash of the asset's module, its group's library code and the specs the group reads."""
    code = [Path(sys.modules[module].__file__ or ""), *(f for rel in _LIBRARY.get(group or "", [])
                                                         for f in _files(REPO_ROOT / rel, "*.py"))]
    labelled = [(p.relative_to(REPO_ROOT).as_posix(), p) for p in code if p.is_file()]
    labelled += [("assets/" + p.relative_to(assets_dir).as_posix(), p) for p in config_files(group, assets_dir)]
    h = hashlib.sha256()
    for label, p in sorted(labelled):
        h.update(label.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def annotate(assets: Sequence[dg.AssetsDefinition], catalog_path: Path | None = None) -> list[Any]:
    """The same assets with kinds, owners, code versions, column schemas and table URIs."""
    path = catalog_path or ASSETS_DIR / "catalog.yaml"
    catalog = load_catalog(path)
    _check_catalog_names(catalog, path, assets)
    schemas = lake_schemas()
    out = []
    for a in assets:
        module = a.op.compute_fn.decorated_fn.__module__

        def spec_with(spec: dg.AssetSpec, module: str = module) -> dg.AssetSpec:
            name = spec.key.to_user_string()
            meta = {"dagster/column_schema": column_schema(schemas[name]), "dagster/uri": table_uri(name),
                    "dagster/table_name": name} if name in schemas else {}
            spec = spec.merge_attributes(metadata=meta, kinds=set(catalog.kinds.get(name, ())),
                                         owners=list(catalog.owners.get(spec.group_name or "", ())))
            return spec.replace_attributes(code_version=code_version(module, spec.group_name))

        out.extend(dg.map_asset_specs(spec_with, [a]))
    return out


def _check_catalog_names(catalog: CatalogConfig, path: Path, assets: Sequence[dg.AssetsDefinition]) -> None:
    """A group or asset name catalog.yaml does not know is a typo: its owners or kinds would be dropped."""
    keys = [spec.key.to_user_string() for a in assets for spec in a.specs]
    groups = {spec.group_name for a in assets for spec in a.specs}
    for section, what, names, known in (("owners", "asset group", catalog.owners, groups),
                                        ("kinds", "asset", catalog.kinds, set(keys))):
        for name in names:
            if name not in known:
                raise ConfigError(f"{path}: field '{section}.{name}': no such {what}; known: {sorted(map(str, known))}")
