"""Douban (DTCDR, via Diff-MSR): music, book and movie ratings, binarised; one surface per domain.

Files `douban_<domain>_{train,val,test}.csv`, header `0,1,2,3` = domain (0 music, 1 book,
2 movie), user, item, label. Column `0` names the surface (source.yaml `surfaces`); item ids stay
as they are (disjoint per domain in the data); the label is the click. No timestamps: see
common.assign_days and NOON.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gem_model.config import CalendarConfig, SurfacesConfig
from gem_pipelines.sources.common import (
    NOON,
    ImportResult,
    SourceConfig,
    assign_days,
    field_at,
    map_surface,
    read_rows,
    request_ids,
    source_files,
    write_landing,
)

HEADER = ["0", "1", "2", "3"]


def read_douban(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> pl.DataFrame:
    """Every row of every configured file as an impression row (see common.write_landing)."""
    frames = []
    for role, path in source_files(cfg, src):
        rows, head = read_rows(path)
        if head != HEADER:
            raise ValueError(f"{path}: header {head} is not the Douban header {HEADER}")
        # an unmapped row lands in the partition of the surface its file is named after
        fallback = next((s for s in cfg.surfaces.values() if f"_{s}_" in path.name), next(iter(cfg.surfaces.values())))
        rows = map_surface(rows, field_at(0), cfg, fallback)
        frames.append(
            rows.with_columns(
                role=pl.lit(role),
                user_id=field_at(1),
                ad_id=field_at(2),
                advertiser_id=field_at(2),  # no advertisers: the item is its own
                click=field_at(3),
                conversion=pl.lit(None, pl.String),
                seconds=pl.lit(NOON),
                request_id=request_ids(rows),
            )
        )
    return assign_days(pl.concat(frames), cfg, calendar)


def unclicked_history(rows: pl.DataFrame, cfg: SourceConfig) -> pl.DataFrame | None:
    """source.yaml `unclicked_as: view`: every mapped row labelled 0 is also the user's organic `view`
    of the item at the impression's time. A history holds only earlier days (all impressions of a day
    share one time), so no label of the row itself or of its day reaches a feature; clicked rows reach
    histories as clicks already (ingest derives paid activity from the label)."""
    if cfg.unclicked_as is None:
        return None
    return (
        rows.filter(pl.col("ok") & (pl.col("click") == "0"))
        .select("source_file", "line_no", "surface", "date", "seconds", "user_id", item_id=pl.col("ad_id"),
                action=pl.lit(cfg.unclicked_as))
        # an item rated twice by a user on one day (the data has such rows) is one view, as ingest keeps it
        .unique(["user_id", "date", "seconds", "item_id", "action"], keep="first", maintain_order=True)
    )  # fmt: skip


def import_douban(
    src: Path, cfg: SourceConfig, surfaces: SurfacesConfig, calendar: CalendarConfig, home: Path, dataset: str = "douban"
) -> ImportResult:
    rows = read_douban(src, cfg, calendar)
    return write_landing(dataset, src, rows, unclicked_history(rows, cfg), surfaces, calendar, home)
