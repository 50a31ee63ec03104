"""Every real row accounted for: per source file, rows read = imported (an `events` row) +
quarantined (an `events_quarantine` row), recounted from the lake through the import's lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from gem_model.config import validate_name
from gem_model.store.atomic import write_json
from gem_model.store.paths import gem_home, lake_root, reports_dir
from gem_pipelines.sources.common import FEED


def source_accounting(dataset: str, home: Path | None = None, lake: str | None = None) -> list[dict[str, Any]]:
    """Rows {source_file, read, imported, quarantined, missing, reasons} from lineage + lake tables."""
    validate_name(dataset, "dataset")
    home = home or gem_home()
    root = (lake or lake_root()).rstrip("/")
    lineage = pl.read_parquet(home / "imports" / dataset / "lineage.parquet").filter(pl.col("kind") == "row")
    events = pl.scan_delta(f"{root}/events").select("request_id").collect()
    quarantine = (
        pl.scan_delta(f"{root}/events_quarantine")
        .filter(pl.col("source_file") == FEED)
        .select("surface", "date", pl.col("line_no").alias("feed_line"), "reason")
        .collect()
    )
    q = lineage.join(quarantine, on=["surface", "date", "feed_line"], how="inner")
    # a later copy of a line shares its first copy's request id: only a line not quarantined is imported
    kept = lineage.join(quarantine, on=["surface", "date", "feed_line"], how="anti")
    imported = kept.join(events, on="request_id", how="semi").group_by("source_file").len("imported")
    by_reason = q.group_by("source_file", "reason").len()
    read = lineage.group_by("source_file").len("read")
    table = (
        read.join(imported, on="source_file", how="left")
        .join(q.group_by("source_file").len("quarantined"), on="source_file", how="left")
        .fill_null(0)
        .with_columns(missing=pl.col("read") - pl.col("imported") - pl.col("quarantined"))
        .sort("source_file")
    )
    rows = table.to_dicts()
    # the import's per-file counts (e.g. time_clamped, exact_duplicates of the generic importer)
    manifest = home / "imports" / dataset / "manifest.json"
    notes = json.loads(manifest.read_text()).get("notes", {}) if manifest.is_file() else {}
    per_file = {k: v for k, v in notes.items() if isinstance(v, dict) and all(isinstance(n, int) for n in v.values())}
    for r in rows:
        sub = by_reason.filter(pl.col("source_file") == r["source_file"])
        r["reasons"] = {k: int(v) for k, v in sub.select("reason", "len").iter_rows()}
        r.update({k: v.get(r["source_file"], 0) for k, v in per_file.items()})
    return rows


def write_accounting(dataset: str, home: Path | None = None, lake: str | None = None) -> Path:
    rows = source_accounting(dataset, home, lake)
    return write_json(reports_dir(home) / "source_accounting.json",
                      {"dataset": dataset, "files": rows, "all_accounted": all(r["missing"] == 0 for r in rows)})
