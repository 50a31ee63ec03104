"""MIND news impressions (Microsoft), in the CSV layout of Scenario-Wise-Rec: category = surface.

Header `User_ID,News_ID,label,Category,SubCategory`: User_ID `U<digits>` -> user_id, News_ID
`N<digits>` -> ad_id (the prefix letter dropped; any other text is carried as is and quarantined
as bad_type), SubCategory -> advertiser_id (a stable 31-bit blake2b of the text: the publisher-like
grouping of a news item), label -> click, Category -> surface (source.yaml `surfaces`, one domain
per category). No time: users are split by the seeded per-user rule (common.user_roles).
"""

from __future__ import annotations

import hashlib
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
    user_roles,
    write_landing,
)

HEADER = ["User_ID", "News_ID", "label", "Category", "SubCategory"]


def _strip_prefix(expr: pl.Expr, letter: str) -> pl.Expr:
    """`U123` -> `123`; anything else unchanged (so the row rules see it and say bad_type)."""
    return pl.when(expr.str.contains(f"^{letter}[0-9]+$")).then(expr.str.slice(1)).otherwise(expr)


def text_id(values: list[str | None]) -> list[str | None]:
    """A stable positive id for a text value (blake2b, 31 bits); null stays null."""
    return [None if v is None else str(int.from_bytes(hashlib.blake2b(v.encode(), digest_size=4).digest(), "little") >> 1)
            for v in values]


def read_mind(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> pl.DataFrame:
    frames = []
    for role, path in source_files(cfg, src):
        if role != "all":
            raise ValueError(f"{path.name}: the MIND sample has no split files; list it under files.all")
        rows, head = read_rows(path)
        if head != HEADER:
            raise ValueError(f"{path}: header {head} is not the MIND header {HEADER}")
        rows = map_surface(rows, field_at(3), cfg, next(iter(cfg.surfaces.values())))
        rows = rows.with_columns(
            user_id=_strip_prefix(field_at(0), "U"),
            ad_id=_strip_prefix(field_at(1), "N"),
            advertiser_id=pl.Series(text_id(rows.select(sub=field_at(4))["sub"].to_list()), dtype=pl.String),
            click=field_at(2),
            conversion=pl.lit(None, pl.String),
            seconds=pl.lit(NOON),
            request_id=request_ids(rows),
        )
        frames.append(rows)
    rows = pl.concat(frames)
    key = rows.select(pl.when(pl.col("ok")).then(pl.col("user_id")).otherwise(pl.col("raw")))["user_id"].to_list()
    return assign_days(rows.with_columns(role=pl.Series(user_roles(key, cfg))), cfg, calendar)


def import_mind(
    src: Path, cfg: SourceConfig, surfaces: SurfacesConfig, calendar: CalendarConfig, home: Path, dataset: str = "mind"
) -> ImportResult:
    return write_landing(dataset, src, read_mind(src, cfg, calendar), None, surfaces, calendar, home)
