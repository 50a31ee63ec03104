"""Every real row accounted for: per source file, rows read = imported (an `events` row) +
quarantined (an `events_quarantine` row), recounted from the lake through the import's lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from gem_model.config import validate_name
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
    imported = lineage.join(events, on="request_id", how="semi").group_by("source_file").len("imported")
    q = lineage.join(quarantine, on=["surface", "date", "feed_line"], how="inner")
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
    for r in rows:
        sub = by_reason.filter(pl.col("source_file") == r["source_file"])
        r["reasons"] = {k: int(v) for k, v in sub.select("reason", "len").iter_rows()}
    return rows


def write_accounting(dataset: str, home: Path | None = None, lake: str | None = None) -> Path:
    rows = source_accounting(dataset, home, lake)
    path = reports_dir(home) / "source_accounting.json"
    path.write_text(json.dumps({"dataset": dataset, "files": rows,
                                "all_accounted": all(r["missing"] == 0 for r in rows)}, indent=2, default=str))
    return path
