"""Where state lives: GEM_HOME (local, absolute) and the lake root (local path or object-store URI)."""

from __future__ import annotations

from pathlib import Path

from gem_model.config import env, gem_home, validate_name
from gem_model.store.object_store import check_lake_uri, resolve_storage_options


def lake_root() -> str:
    """GEM_LAKE_URI (e.g. s3://bucket/lake; refused with credentials in it) or $GEM_HOME/lake."""
    return check_lake_uri((env("GEM_LAKE_URI") or str(gem_home() / "lake")).rstrip("/"))


def table_uri(table: str, root: str | None = None) -> str:
    """Exactly `<lake>/<table>`; the table name is validated before it touches a path."""
    validate_name(table, "table")
    return f"{(root or lake_root()).rstrip('/')}/{table}"


def storage_options(uri: str | None = None) -> dict[str, str] | None:
    """Object-store options for `uri` (default: the lake)."""
    return resolve_storage_options(uri or lake_root())


def models_dir(asset: str, partition: str | None = None, home: Path | None = None) -> Path:
    validate_name(asset.replace("-", "_"), "asset")
    base = (home or gem_home()) / "models" / asset
    if partition is not None:
        validate_name(partition, "partition")
        base = base / partition
    return base


def reports_dir(home: Path | None = None) -> Path:
    d = (home or gem_home()) / "reports"
    d.mkdir(parents=True, exist_ok=True)
    return d
