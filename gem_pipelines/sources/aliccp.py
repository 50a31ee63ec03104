"""Ali-CCP (Tianchi 408, the ESMM data): Taobao ads with click and purchase labels, scenario = surface.

Reads the label-encoded CSV layout the public multi-scenario code bases distribute (Scenario-Wise-
Rec, PaddleRec AITM): a header naming `click`, `purchase` and the field ids, of which `101` (user),
`205` (item), `207` (shop) and `301` (scenario) are used: user -> user_id, item -> ad_id, shop ->
advertiser_id, scenario -> surface (source.yaml `surfaces`), click -> click, purchase -> conversion.
Other columns are ignored. Split: the files' own roles (test -> E, val -> E-1, train -> warm-up ..
E-2 by the seeded per-row rule); the data has no time (every impression at D 12:00:00Z).
Tianchi's own layout (sample_skeleton + common_features, source.yaml `common`) is read by
read_tianchi (assets/sources/aliccp_full).

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
    user_roles,
    write_landing,
)

REQUIRED = ("click", "purchase", "101", "205", "207", "301")
SKELETON_FIELDS, COMMON_FIELDS = 6, 3  # Tianchi's sample_skeleton_*.csv and common_features_*.csv
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


def tianchi_field(feats: pl.Expr, field: str) -> pl.Expr:
    """The feature id of `field` in a Tianchi feature list (`field\\x02id\\x03value` joined by \\x01);
    the first one where a field repeats; null where the list lacks it."""
    return feats.str.extract(f"(?:^|\x01){field}\x02([^\x03\x01]*)\x03")


def read_tianchi(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> tuple[pl.DataFrame, dict[str, int]]:
    """Ali-CCP as Tianchi distributes it: sample_skeleton_*.csv (sample id, click, purchase, md5 of the
    user's common features, feature count, feature list; no header) and common_features_*.csv (md5,
    feature count, feature list). Field 101 (user) comes from the common features joined on the md5;
    205 item, 207 shop and 301 scenario from the sample's own list (raw feature ids, as in the files).
    A sample whose md5 has no common features keeps a null user (quarantined `missing_id`); a line
    with another field count lands verbatim (unparseable). No time, no validation file: users are
    split by the seeded per-user rule (common.user_roles), like the datasets without split files."""
    common = []
    for name in cfg.common:
        path = src / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: common features file of source.yaml `common` is missing (README)")
        rows, _ = read_rows(path, header=False, n_fields=COMMON_FIELDS)
        common.append(rows.filter("ok").select(md5=field_at(0), user_id=tianchi_field(field_at(2), "101")))
    users = pl.concat(common).unique("md5", keep="first", maintain_order=True)
    frames = []
    for _, path in source_files(cfg, src):
        rows, _ = read_rows(path, header=False, n_fields=SKELETON_FIELDS)
        rows = rows.with_columns(md5=field_at(3), feats=field_at(5)).join(users, on="md5", how="left", maintain_order="left")
        rows = map_surface(rows, tianchi_field(pl.col("feats"), "301"), cfg, next(iter(cfg.surfaces.values())))
        frames.append(rows.with_columns(
            user_id=pl.when("ok").then(pl.col("user_id")),
            ad_id=tianchi_field(pl.col("feats"), "205"),
            advertiser_id=tianchi_field(pl.col("feats"), "207"),
            click=field_at(1),
            conversion=field_at(2),
            seconds=pl.lit(NOON),
            request_id=request_ids(rows),
        ))
    rows, n = apply_purchase_rule(pl.concat(frames, how="diagonal_relaxed"), cfg.purchase_without_click)
    key = rows.select(pl.when(pl.col("ok")).then(pl.col("user_id")).otherwise(pl.col("raw")))["user_id"].to_list()
    return assign_days(rows.with_columns(role=pl.Series(user_roles(key, cfg))), cfg, calendar), {PURCHASE_WITHOUT_CLICK: n}


def import_aliccp(
    src: Path, cfg: SourceConfig, surfaces: SurfacesConfig, calendar: CalendarConfig, home: Path, dataset: str = "aliccp"
) -> ImportResult:
    rows, notes = (read_tianchi if cfg.common else read_aliccp)(src, cfg, calendar)
    notes = {**notes, "purchase_without_click_rule": cfg.purchase_without_click}
    return write_landing(dataset, src, rows, None, surfaces, calendar, home, notes=notes)
