"""Delta Lake IO: partition-exact, schema-checked, atomic writes and pruned reads.

A partition is replaced by one Delta commit (`overwrite` with a predicate on the partition
columns), so re-materializing is idempotent and a failed write leaves the previous version.
Every write and OPTIMIZE/VACUUM goes through gem_model.store.delta: one writer per partition, maintenance
never overlapping a write, commit conflicts retried, and the version returned is this write's own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from gem_model.config import validate_name
from gem_model.store.delta import overwrite_partition, table_lock
from gem_model.store.paths import storage_options, table_uri

PARTITION_COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("date", "surface"),
    "user_activity": ("date", "surface"),
    "events_quarantine": ("date", "surface"),
    "oracle": ("date", "surface"),
    "training_examples": ("date",),
    "teacher_predictions": ("date",),
}


class SchemaMismatch(TypeError):
    """The frame does not have the table's declared dtypes; Delta would cast silently, so refuse."""


def _literal(value: object) -> str:
    if isinstance(value, dt.date):
        return f"'{value.isoformat()}'"
    if isinstance(value, str):
        validate_name(value, "partition value")
        return f"'{value}'"
    raise TypeError(f"unsupported partition value {value!r}")


def check_schema(df: pl.DataFrame, schema: Mapping[str, pl.DataType], table: str) -> None:
    actual = dict(df.schema)
    if list(actual) != list(schema):
        raise SchemaMismatch(f"{table}: columns {list(actual)} differ from the declared {list(schema)}")
    if wrong := {c: (str(actual[c]), str(t)) for c, t in schema.items() if actual[c] != t}:
        raise SchemaMismatch(f"{table}: dtypes differ from the declared schema (actual, declared): {wrong}")


def check_write(
    df: pl.DataFrame,
    table: str,
    partition: Mapping[str, object],
    schema: Mapping[str, pl.DataType],
    *,
    root: str | None = None,
) -> None:
    """Every reason `write_partition` would refuse `df`, checked without writing: the declared schema, the
    partition's columns and values, and the existing table's own schema. delta-rs refuses only other column
    names and casts any other dtype silently (float 2.7 -> int 2), so a dtype the table does not have is
    refused here too. A caller writing several tables checks them all first, so a bad frame commits none."""
    check_schema(df, schema, table)
    columns = PARTITION_COLUMNS[table]
    if set(partition) != set(columns):
        raise ValueError(f"{table}: partition must name exactly {columns}, got {sorted(partition)}")
    for col, value in partition.items():
        _literal(value)  # a value the commit's predicate cannot name
        if df.height and df.filter(pl.col(col) != value).height:
            raise ValueError(f"{table}: frame has rows outside partition {col}={value!r}")
    uri = table_uri(table, root)
    try:
        existing = dict(pl.scan_delta(DeltaTable(uri, storage_options=storage_options())).collect_schema())
    except TableNotFoundError:
        return  # the first write creates the table with the declared schema
    if existing != dict(schema):
        new, gone = sorted(set(schema) - set(existing)), sorted(set(existing) - set(schema))
        wrong = {c: (str(existing[c]), str(t)) for c, t in schema.items() if c in existing and existing[c] != t}
        raise SchemaMismatch(f"{uri}: the table lacks columns {new}, has others {gone}, other dtypes (table, "
                             f"declared) {wrong}; the lake was written by another version: "
                             "re-materialize every partition of the table (`make clean && make demo` rebuilds the "
                             "demo's lake)")


def write_partition(
    df: pl.DataFrame,
    table: str,
    partition: Mapping[str, object],
    schema: Mapping[str, pl.DataType],
    *,
    root: str | None = None,
    checked: bool = False,
) -> int:
    """Replace exactly `partition` (e.g. {"date": d, "surface": "feed"}) of `table` with `df`; returns the
    Delta version this write's commit created. A frame `check_write` refuses raises before any commit
    (`checked`: the caller ran check_write on this frame already, as ingest does for its three tables)."""
    if not checked:
        check_write(df, table, partition, schema, root=root)
    columns = PARTITION_COLUMNS[table]
    predicate = " AND ".join(f"{c} = {_literal(partition[c])}" for c in columns)
    lock_key = "__".join(f"{c}={partition[c]}" for c in columns)
    return overwrite_partition(df, table_uri(table, root), partition_by=columns, lock_keys=[lock_key],
                               predicate=predicate, storage_options=storage_options())


def table_version(table: str, *, root: str | None = None) -> int | None:
    try:
        return DeltaTable(table_uri(table, root), storage_options=storage_options()).version()
    except TableNotFoundError:
        return None


def table_exists(table: str, *, root: str | None = None) -> bool:
    return table_version(table, root=root) is not None


def scan(table: str, *, root: str | None = None) -> pl.LazyFrame:
    return pl.scan_delta(table_uri(table, root), storage_options=storage_options())


def read_partition(
    table: str,
    dates: dt.date | Sequence[dt.date],
    surfaces: str | Sequence[str] | None = None,
    *,
    columns: Sequence[str] | None = None,
    root: str | None = None,
) -> pl.DataFrame:
    """Rows of the given date(s) (and surface(s)); partition pruning keeps it to those files."""
    dates = [dates] if isinstance(dates, dt.date) else list(dates)
    lf = scan(table, root=root).filter(pl.col("date").is_in(dates))
    if surfaces is not None:
        lf = lf.filter(pl.col("surface").is_in([surfaces] if isinstance(surfaces, str) else list(surfaces)))
    if columns is not None:
        lf = lf.select(columns)
    return lf.collect()


def optimize_and_vacuum(table: str, *, retention_hours: int = 168, root: str | None = None) -> dict[str, object]:
    """Compact small files, then vacuum files unreferenced for longer than `retention_hours` (below 7 days
    would break time travel and readers of older versions: refused)."""
    if retention_hours < 168:
        raise ValueError("retention_hours below 168 (7 days) is unsafe for concurrent readers")
    uri = table_uri(table, root)
    with table_lock(uri):  # no partition write of this table runs meanwhile
        dt_ = DeltaTable(uri, storage_options=storage_options())
        compacted = dt_.optimize.compact()
        removed = dt_.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=True)
    return {
        "files_added": compacted.get("numFilesAdded", 0),
        "files_removed": compacted.get("numFilesRemoved", 0),
        "vacuumed_files": len(removed),
        "version": dt_.version(),
    }
