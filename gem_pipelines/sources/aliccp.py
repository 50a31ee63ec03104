"""Ali-CCP (Tianchi 408, the ESMM data): Taobao ads with click and purchase labels, scenario = surface.

Reads the label-encoded CSV layout the public multi-scenario code bases distribute (Scenario-Wise-
Rec, PaddleRec AITM): a header naming `click`, `purchase` and the field ids, of which `101` (user),
`205` (item), `207` (shop) and `301` (scenario) are used: user -> user_id, item -> ad_id, shop ->
advertiser_id, scenario -> surface (source.yaml `surfaces`), click -> click, purchase -> conversion.
Other columns are ignored. Split: the files' own roles (test -> E, val -> E-1, train -> warm-up ..
E-2 by the seeded per-row rule); the data has no time (every impression at D 12:00:00Z).

A purchase without a click (real: 2 of the 48 AITM rows) breaks the click -> purchase funnel the
conversion label measures (ESMM's post-click conversion). source.yaml `purchase_without_click`:
`drop_purchase` (default) keeps the impression with click 0 and conversion 0, and counts the rows
in the import's notes; `keep` keeps conversion 1 (a view-through conversion) as the data says.
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

REQUIRED = ("click", "purchase", "101", "205", "207", "301")
PURCHASE_WITHOUT_CLICK = "purchase_without_click"


def apply_purchase_rule(rows: pl.DataFrame, rule: str) -> tuple[pl.DataFrame, int]:
    """The documented rule for purchase = 1 with click = 0; returns (rows, rows it applies to)."""
    quirk = (pl.col("conversion") == "1") & (pl.col("click") == "0")
    n = int(rows.select(quirk.fill_null(False).sum()).item())
    if rule == "drop_purchase":
        rows = rows.with_columns(conversion=pl.when(quirk).then(pl.lit("0")).otherwise(pl.col("conversion")))
    return rows, n


def read_aliccp(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> tuple[pl.DataFrame, dict[str, int]]:
    frames = []
    for role, path in source_files(cfg, src):
        rows, head = read_rows(path)
        missing = [c for c in REQUIRED if c not in head]
        if missing:
            raise ValueError(f"{path}: header lacks the Ali-CCP columns {missing}")
        col = {c: head.index(c) for c in REQUIRED}
        rows = map_surface(rows, field_at(col["301"]), cfg, next(iter(cfg.surfaces.values())))
        frames.append(
            rows.with_columns(
                role=pl.lit("train" if role == "all" else role),
                user_id=field_at(col["101"]),
                ad_id=field_at(col["205"]),
                advertiser_id=field_at(col["207"]),
                click=field_at(col["click"]),
                conversion=field_at(col["purchase"]),
                seconds=pl.lit(NOON),
                request_id=request_ids(rows),
            )
        )
    rows, n = apply_purchase_rule(pl.concat(frames), cfg.purchase_without_click)
    return assign_days(rows, cfg, calendar), {PURCHASE_WITHOUT_CLICK: n}


def import_aliccp(
    src: Path, cfg: SourceConfig, surfaces: SurfacesConfig, calendar: CalendarConfig, home: Path, dataset: str = "aliccp"
) -> ImportResult:
    rows, notes = read_aliccp(src, cfg, calendar)
    notes = {**notes, "purchase_without_click_rule": cfg.purchase_without_click}
    return write_landing(dataset, src, rows, None, surfaces, calendar, home, notes=notes)
