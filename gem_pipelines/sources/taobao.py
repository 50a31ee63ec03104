"""Taobao display ads (Tianchi 56, DMR layout of PaddleRec): one impression per row, ad slot = surface.

`alimama_sampled_train_dmr.txt`: no header, 267 comma-separated columns: 0-49 btag_his (behaviour
type), 50-99 cate_his, 100-149 brand_his, 150-199 mask (1 = a real step; sequences are left
padded, the last step is the most recent), 200-249 match_mask, 250 user, 251-258 user profile,
259 adgroup_id, 260 cate_id, 261 campaign_id, 262 customer, 263 brand, 264 price, 265 pid, 266 clk.

Step k of the behaviour sequence (mask 1) is the user's organic activity at D 00:00 + k minutes, so
it precedes the impression at D 12:00; item = brand_his[k], the finest id the sequence has.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gem_model.config import CalendarConfig
from gem_pipelines.sources.common import (
    NOON,
    SourceConfig,
    assign_days,
    field_at,
    map_surface,
    read_rows,
    request_ids,
    source_files,
    split_by_user,
)

N_FIELDS, SEQ = 267, 50
BTAG, BRAND, MASK = 0, 100, 150
USER, ADGROUP, CUSTOMER, PID, CLK = 250, 259, 262, 265, 266
# Tianchi behaviour types as DMR encodes them (1 pv, 2 cart, 3 fav, 4 buy) -> the closed organic
# action vocabulary; a code outside this map is carried as is and quarantined as unknown_enum.
BTAG_ACTIONS = {"1": "view", "2": "save", "3": "like", "4": "click"}


def read_taobao(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """(impression rows, history steps, no notes) of every configured file."""
    frames = []
    for role, path in source_files(cfg, src):
        if role != "all":
            raise ValueError(f"{path.name}: the Taobao sample has no split files; list it under files.all")
        rows, _ = read_rows(path, header=False, n_fields=N_FIELDS)
        rows = map_surface(rows, field_at(PID), cfg)
        frames.append(
            rows.with_columns(
                user_id=field_at(USER),
                ad_id=field_at(ADGROUP),
                advertiser_id=field_at(CUSTOMER),
                click=field_at(CLK),
                conversion=pl.lit(None, pl.String),
                seconds=pl.lit(NOON),
                request_id=request_ids(),
            )
        )
    rows = assign_days(split_by_user(pl.concat(frames), cfg), cfg, calendar)

    history = (
        rows.filter("ok")
        .select(
            "source_file", "line_no", "surface", "date", "user_id",
            btag=pl.col("fields").list.slice(BTAG, SEQ),
            item_id=pl.col("fields").list.slice(BRAND, SEQ),
            mask=pl.col("fields").list.slice(MASK, SEQ),
            k=pl.int_ranges(0, SEQ),
        )
        .explode("btag", "item_id", "mask", "k")
        .filter(pl.col("mask") == "1")  # the steps of each history
        .with_columns(
            seconds=pl.col("k").cast(pl.Int64) * 60,
            action=pl.col("btag").replace(BTAG_ACTIONS),
        )
        .unique(["user_id", "date", "seconds", "item_id", "action"], keep="first", maintain_order=True)
        .select("source_file", "line_no", "surface", "date", "seconds", "user_id", "item_id", "action")
    )  # fmt: skip
    return rows, history, {}
