"""MIND as Microsoft distributes it (behaviors.tsv + news.tsv, no header): a module, because one
behaviors line holds many impressions (`N<id>-<label>` candidates) and a history column, and the
surface is the category of a news.tsv row, which no spec expresses. The Scenario-Wise-Rec CSV
layout of MIND is a spec (assets/sources/mind/source.yaml).

user `U<digits>` -> user_id, news `N<digits>` -> ad_id (the prefix letter dropped; any other text
is carried as is and quarantined as bad_type), subcategory -> advertiser_id (spec.text_id), the
candidate's label -> click, its category -> surface (source.yaml `surfaces`).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from gem_model.config import CalendarConfig
from gem_pipelines.sources.common import (
    NOON,
    SourceConfig,
    field_at,
    map_surface,
    need_file,
    read_rows,
    request_ids,
    source_files,
    strip_prefix,
)
from gem_pipelines.sources.spec import text_id

BEHAVIORS_FIELDS, NEWS_FIELDS = 5, 8  # MIND's original behaviors.tsv and news.tsv (no header)


def read_news(src: Path, cfg: SourceConfig) -> pl.DataFrame:
    """news.tsv (MIND original layout, no header, 8 tab-separated fields): news_id, category,
    subcategory. A line with another field count is skipped: its news' impressions then have no
    category and are quarantined as unparseable."""
    frames = [read_rows(need_file(src / name), sep="\t", header=False, n_fields=NEWS_FIELDS)[0].filter("ok")
              .select(news=field_at(0), category=field_at(1), subcategory=field_at(2)) for name in cfg.news]
    if not frames:
        raise ValueError("MIND behaviors.tsv needs its news.tsv: list it under `news:` in source.yaml")
    return pl.concat(frames).unique("news", keep="first", maintain_order=True)


def read_mind_tsv(src: Path, cfg: SourceConfig, calendar: CalendarConfig) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """behaviors.tsv (impression id, user, time, history, impressions): one impression row per candidate
    `N<id>-<label>` (request_id `<file stem>:<line>:<k>`) at its line's time, the data's days in order
    onto the calendar's (the split is by time: its last day is E). A line with the wrong field count or
    an unreadable time lands verbatim (unparseable). The `history` column (clicks before the logged
    period) becomes organic clicks at 00:00 of the first day, one per user and news; those of
    undeclared categories are counted in the notes, not written."""
    news = read_news(src, cfg)
    frames = []
    for _, path in source_files(cfg, src):
        rows, _ = read_rows(path, sep="\t", header=False, n_fields=BEHAVIORS_FIELDS)
        ts = field_at(2).str.strptime(pl.Datetime("us"), "%m/%d/%Y %I:%M:%S %p", strict=False)
        rows = rows.with_columns(ts=ts).with_columns(ok=pl.col("ok") & pl.col("ts").is_not_null())
        frames.append(rows.with_columns(cand=pl.when("ok").then(field_at(4).str.split(" ")).otherwise([None]),
                                        hist=field_at(3)))
    lines = pl.concat(frames)
    first = lines.filter("ok")["ts"].min()
    days = calendar.dates()
    rows = lines.explode("cand").with_columns(k=pl.int_range(pl.len()).over("source_file", "line_no"))
    rows = rows.with_columns(
        ok=pl.col("ok") & pl.col("cand").str.contains(r"^[^-]+-[^-]+$").fill_null(False),
        request_id=request_ids() + ":" + pl.col("k").cast(pl.String),
        news=pl.col("cand").str.replace(r"-[^-]*$", ""),
        click=pl.col("cand").str.extract(r"-([^-]*)$"),
        day=(pl.col("ts").dt.date() - (first.date() if first else dt.date.min)).dt.total_days(),
        # the click lands 1 s later: an impression in the day's last second moves 1 s earlier
        seconds=(pl.col("ts") - pl.col("ts").dt.truncate("1d")).dt.total_seconds().clip(0, 86400 - 2),
    ).join(news, on="news", how="left", maintain_order="left")
    late = rows.filter(pl.col("ok") & (pl.col("day") >= len(days)))
    if late.height:
        raise ValueError(f"MIND behaviors span {int(late['day'].max()) + 1} days; the calendar has {len(days)}: set "
                         "`days` in the dataset's calendar.yaml")
    rows = map_surface(rows, pl.col("category"), cfg)
    rows = rows.with_columns(
        date=pl.col("day").fill_null(0).replace_strict(list(range(len(days))), days, default=days[0]),
        user_id=strip_prefix(field_at(1), "U"),
        ad_id=strip_prefix(pl.col("news"), "N"),
        advertiser_id=pl.Series(text_id(rows["subcategory"].to_list()), dtype=pl.String),
        conversion=pl.lit(None, pl.String),
        seconds=pl.col("seconds").fill_null(NOON),
    )
    hist = (
        rows.filter("ok").unique(["source_file", "line_no"], keep="first", maintain_order=True)
        .select("source_file", "line_no", "user_id", news=pl.col("hist").str.split(" "))
        .explode("news").filter(pl.col("news").is_not_null() & (pl.col("news") != ""))
        .unique(["user_id", "news"], keep="first", maintain_order=True)
        .join(news, on="news", how="left", maintain_order="left")
        .with_columns(surface=pl.col("category").replace_strict(cfg.surfaces, default=None))
    )  # fmt: skip
    history = hist.filter(pl.col("surface").is_not_null()).select(
        "source_file", "line_no", "surface", date=pl.lit(days[0]), seconds=pl.lit(0, pl.Int64), user_id="user_id",
        item_id=strip_prefix(pl.col("news"), "N"), action=pl.lit("click"),
    )
    return rows, history, {"history_clicks_of_undeclared_categories": hist.height - history.height}
