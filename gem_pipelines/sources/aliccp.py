"""Ali-CCP (Tianchi 408) as Tianchi distributes it (assets/sources/aliccp_full): a module, as the ids sit
in feature lists and the user in another file joined by md5 (the label-encoded CSV layout is a spec).

sample_skeleton_*.csv (sample id, click, purchase, md5 of the user's common features, feature count,
feature list; no header) and common_features_*.csv (md5, feature count, feature list): user 101 from
the common features, item 205, shop 207 and scenario 301 from the sample's list (raw feature ids). A
sample whose md5 has no common features keeps a null user (missing_id). No time, no validation
file: the seeded per-user split.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gem_model.config import CalendarConfig
from gem_pipelines.sources.common import (
    NOON,
    SourceConfig,
    apply_purchase_rule,
    assign_days,
    field_at,
    map_surface,
    need_file,
    read_rows,
    request_ids,
    source_files,
    split_by_user,
)

SKELETON_FIELDS, COMMON_FIELDS = 6, 3  # Tianchi's sample_skeleton_*.csv and common_features_*.csv


def tianchi_field(feats: pl.Expr, field: str) -> pl.Expr:
    """The feature id of `field` in a Tianchi feature list (`field\\x02id\\x03value` joined by \\x01);
    the first one where a field repeats; null where the list lacks it."""
    return feats.str.extract(f"(?:^|\x01){field}\x02([^\x03\x01]*)\x03")


def read_tianchi(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> tuple[pl.DataFrame, None, dict]:
    common = [read_rows(need_file(src / name), header=False, n_fields=COMMON_FIELDS)[0].filter("ok")
              .select(md5=field_at(0), user_id=tianchi_field(field_at(2), "101")) for name in cfg.common]
    users = pl.concat(common).unique("md5", keep="first", maintain_order=True)
    frames = []
    for _, path in source_files(cfg, src):
        rows, _ = read_rows(path, header=False, n_fields=SKELETON_FIELDS)
        rows = rows.with_columns(md5=field_at(3), feats=field_at(5)).join(users, on="md5", how="left", maintain_order="left")
        rows = map_surface(rows, tianchi_field(pl.col("feats"), "301"), cfg)
        frames.append(rows.with_columns(
            user_id=pl.when("ok").then(pl.col("user_id")),
            ad_id=tianchi_field(pl.col("feats"), "205"),
            advertiser_id=tianchi_field(pl.col("feats"), "207"),
            click=field_at(1),
            conversion=field_at(2),
            seconds=pl.lit(NOON),
            request_id=request_ids(),
        ))
    rows, notes = apply_purchase_rule(pl.concat(frames, how="diagonal_relaxed"), cfg)
    return assign_days(split_by_user(rows, cfg), cfg, calendar), None, notes
