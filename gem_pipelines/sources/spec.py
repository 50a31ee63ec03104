"""The generic importer: a log described by source.yaml alone (gem_pipelines/sources/layout.py),
landed through the machinery every importer shares (common.py).

A row that cannot be read (wrong field count, an unreadable time) lands verbatim (unparseable); a
row of an undeclared surface as a record of an unknown kind (unknown_enum); a row outside the window
(out_of_range_ts); a later exact copy of a line, with `duplicates: quarantine`, under its first
copy's request id (duplicate_record). The row rules (gem_pipelines/data/normalize.py) decide.

Timed data (`time`): each row's day is its local day (or its day column), the window the data's
first to last day unless source.yaml bounds it, written to imports/<dataset>/calendar.yaml, which
the graph reads (gem_model.config.spec_path). Untimed data: the seeded day rule of common.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from gem_model.config import CalendarConfig, SurfacesConfig, validate_name
from gem_model.store.atomic import write_text
from gem_pipelines.sources.common import (
    NOON,
    ImportResult,
    SourceConfig,
    apply_purchase_rule,
    assign_days,
    field_at,
    map_surface,
    need_file,
    read_lines,
    read_rows,
    request_ids,
    source_files,
    split_by_user,
    strip_prefix,
    write_landing,
)
from gem_pipelines.sources.layout import ColumnRef, Read, as_column

DAY_S = 86400
LAST_S = DAY_S - 2  # the click lands 1 s after its impression: an impression at most 2 s before midnight


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "1" if v else "0"
    return v if isinstance(v, str) else json.dumps(v)


def _columns(path: Path, head: list[str], need: list[str], optional: list[str]) -> list[str]:
    if missing := [c for c in need if c not in head]:
        raise ValueError(f"{path}: no column {missing} (columns: {head})")
    return list(dict.fromkeys([*need, *(c for c in optional if c in head)]))


def read_table(path: Path, read: Read, need: list[str], optional: list[str]) -> pl.DataFrame:
    """Rows of one file: source_file, line_no, raw, ok and, as text `c:<name>` (null when empty or
    when the row is not ok), each column of `need` and those of `optional` the file has. A csv/tsv
    row is split on the separator (no quoting), so one bad line is one quarantined row."""
    if read.format in ("csv", "tsv"):
        rows, head = read_rows(path, sep=read.sep, header=read.header, n_fields=None if read.header else len(read.names))
        head = head if read.header else list(read.names)
        cols = _columns(path, head, need, optional)
        return rows.with_columns(**{f"c:{c}": field_at(head.index(c)) for c in cols}).drop("fields")
    if read.format == "parquet":
        df = pl.read_parquet(path)
        text = {f"c:{c}": pl.col(c).cast(pl.String) for c in _columns(path, df.columns, need, optional)}
        return df.select(
            source_file=pl.lit(path.name), line_no=pl.int_range(1, pl.len() + 1, dtype=pl.Int64),
            raw=pl.struct(pl.all()).struct.json_encode(), ok=pl.lit(True), **text,
        ).with_columns(pl.when(pl.col(c).str.strip_chars() != "").then(pl.col(c)).alias(c) for c in text)
    lines = read_lines(path)
    records: list[dict | None] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        records.append(rec if isinstance(rec, dict) else None)
    head = list(dict.fromkeys(k for r in records if r for k in r))
    cols = {f"c:{c}": pl.Series([_text(r.get(c)) if r else None for r in records], dtype=pl.String)
            for c in _columns(path, head, need, optional)}
    return pl.DataFrame({
        "source_file": [path.name] * len(lines), "line_no": pl.Series(range(1, len(lines) + 1), dtype=pl.Int64),
        "raw": pl.Series(lines, dtype=pl.String), "ok": pl.Series([r is not None for r in records]), **cols,
    }).with_columns(pl.when(pl.col(c).str.strip_chars() != "").then(pl.col(c)).alias(c) for c in cols)


def text_id(values: list[str | None]) -> list[str | None]:
    """A stable positive id for a text value (blake2b, 31 bits); null stays null."""
    return [None if v is None else str(int.from_bytes(hashlib.blake2b(v.encode(), digest_size=4).digest(), "little") >> 1)
            for v in values]


def _side(path: Path, read: Read) -> pl.DataFrame:
    """A side table as text columns (a real CSV reader: side tables may quote their fields)."""
    if read.format == "parquet":
        return pl.read_parquet(path).with_columns(pl.all().cast(pl.String))
    if read.format == "jsonl":
        return pl.read_ndjson(path).with_columns(pl.all().cast(pl.String))
    return pl.read_csv(path, separator=read.sep, has_header=read.header, infer_schema=False,
                       new_columns=list(read.names) or None)


def _read_log(src: Path, cfg: SourceConfig) -> pl.DataFrame:
    """The log's rows with the side tables joined; a column name resolves in the log first."""
    c, f = cfg.columns, cfg.fields
    assert c is not None
    sides = []
    for t in cfg.side_tables:
        path = need_file(src / t.file)
        df = _side(path, t.read)
        if t.key not in df.columns:
            raise ValueError(f"{path}: no key column {t.key!r} (columns: {df.columns})")
        sides.append((t, df))
    need = [as_column(c.user).column, as_column(c.item).column, c.surface, c.click, c.conversion]
    if cfg.time:
        need += [cfg.time.column, cfg.time.day.column if cfg.time.day else None]
    # the fields' columns: the log's where it has them, else a side table's
    refs = [as_column(f.advertiser_id).column if f.advertiser_id else None, f.user_tenure_days, f.position, f.bid,
            *(as_column(r).column for r in cfg.context.values())]
    rows = pl.concat([read_table(p, cfg.read, [x for x in need if x], [r for r in refs if r]).with_columns(role=pl.lit(role))
                      for role, p in source_files(cfg, src)], how="vertical")
    for t, df in sides:
        key = as_column(c.user if t.joins == "user" else c.item).column
        side = df.unique(t.key, keep="first").rename({k: f"c:{k}" for k in df.columns if k != t.key})
        side = side.drop([k for k in side.columns if k in rows.columns])  # the log's own column wins
        rows = rows.join(side, left_on=f"c:{key}", right_on=t.key, how="left", maintain_order="left")
    return rows


def _ref(rows: pl.DataFrame, ref: ColumnRef | None, what: str) -> pl.Expr | None:
    if ref is None:
        return None
    col = as_column(ref)
    name = f"c:{col.column}"
    if name not in rows.columns:
        raise ValueError(f"source.yaml {what}: no column {col.column!r} in the log or its side tables")
    # an id: prefix stripped (only before digits) or hashed
    v = strip_prefix(pl.col(name), col.strip_prefix) if col.strip_prefix else pl.col(name)
    return pl.lit(pl.Series(text_id(rows.select(v)[name].to_list()), dtype=pl.String)) if col.hash else v


def _timed(rows: pl.DataFrame, cfg: SourceConfig) -> tuple[pl.DataFrame, CalendarConfig, dict[str, int]]:
    """date and seconds (local wall-clock) of every row, the window, and per file how many mapped rows
    had their time clamped into their day."""
    t = cfg.time
    assert t is not None
    ts = None
    if t.column:
        v = pl.col(f"c:{t.column}")
        if t.unit:
            ts = pl.from_epoch(v.cast(pl.Int64, strict=False), time_unit=t.unit).dt.replace_time_zone("UTC")\
                .dt.convert_time_zone(t.timezone).dt.replace_time_zone(None)
        else:
            ts = v.str.strptime(pl.Datetime("us"), t.format, strict=False)
    day = pl.col(f"c:{t.day.column}").str.strptime(pl.Date, t.day.format, strict=False) if t.day else ts.dt.date()
    rows = rows.with_columns(day=day, _ts=ts if ts is not None else pl.lit(None, pl.Datetime("us")))
    parsed = pl.col("day").is_not_null() & (pl.col("_ts").is_not_null() if t.column else pl.lit(True))
    rows = rows.with_columns(ok=pl.col("ok") & parsed, unmapped=pl.col("unmapped") & parsed)
    secs = (pl.col("_ts") - pl.col("day").cast(pl.Datetime("us"))).dt.total_seconds() if t.column else pl.lit(NOON)
    rows = rows.with_columns(_secs=secs)
    outside = rows.filter(pl.col("ok") & ((pl.col("_secs") < 0) | (pl.col("_secs") >= DAY_S)))
    clamped = {f: int(n) for f, n in outside.group_by("source_file").len().iter_rows()}
    rows = rows.with_columns(_secs=pl.col("_secs").clip(0, LAST_S))
    present = rows.filter(pl.col("ok") | pl.col("unmapped"))["day"]
    if present.is_empty():
        raise ValueError(f"{cfg.default_dir}: no readable row with a time: the window cannot come from the data")
    start, end = t.first_day or present.min(), t.last_day or present.max()
    calendar = CalendarConfig(start=start, days=(end - start).days + 1, teacher_lag_days=t.teacher_lag_days)
    # a row outside the window keeps its time and lands on the nearest day of it: out_of_range_ts
    date = pl.col("day").fill_null(start).clip(start, end)
    rows = rows.with_columns(
        date=date, seconds=(pl.col("day").fill_null(start) - date).dt.total_days() * DAY_S + pl.col("_secs").fill_null(NOON)
    )
    return rows.drop("day", "_ts", "_secs"), calendar, clamped


def unclicked_history(rows: pl.DataFrame, cfg: SourceConfig) -> pl.DataFrame | None:
    """source.yaml `unclicked_as: view`: every mapped row labelled 0 is also the user's organic `view` of
    the item at the impression's time (histories hold only earlier days); clicks reach them via ingest."""
    if cfg.unclicked_as is None:
        return None
    return (
        rows.filter(pl.col("ok") & (pl.col("click") == "0"))
        .select("source_file", "line_no", "surface", "date", "seconds", "user_id", item_id=pl.col("ad_id"),
                action=pl.lit(cfg.unclicked_as))
        # an item rated twice by a user on one day is one view, as ingest keeps it
        .unique(["user_id", "date", "seconds", "item_id", "action"], keep="first", maintain_order=True)
    )  # fmt: skip


def read_spec(src: Path, cfg: SourceConfig, calendar: CalendarConfig | None) -> tuple[pl.DataFrame, CalendarConfig, dict]:
    """Impression rows (see common.write_landing), the window and the import's notes."""
    c, f = cfg.columns, cfg.fields
    assert c is not None
    rows = _read_log(src, cfg)
    rows = map_surface(rows, pl.col(f"c:{c.surface}"), cfg)
    rows = rows.with_columns(
        user_id=_ref(rows, c.user, "columns.user"),
        ad_id=_ref(rows, c.item, "columns.item"),
        advertiser_id=_ref(rows, f.advertiser_id or c.item, "fields.advertiser_id"),  # none: the item's own
        click=pl.col(f"c:{c.click}"),
        conversion=pl.col(f"c:{c.conversion}") if c.conversion else pl.lit(None, pl.String),
        tenure_days=_ref(rows, f.user_tenure_days, "fields.user_tenure_days"),
        position=_ref(rows, f.position, "fields.position"),
        bid=_ref(rows, f.bid, "fields.bid"),
        request_id=request_ids(),
        **{f"context.{name}": _ref(rows, ref, f"context.{name}") for name, ref in cfg.context.items()},
    )
    rows, notes = apply_purchase_rule(rows, cfg)
    if cfg.duplicates == "quarantine":
        # every copy of a line carries its first copy's id: the row rules file the later ones duplicate_record
        first = pl.col("request_id").first().over("raw")
        copies = rows.filter(pl.col("ok") & (pl.col("request_id") != first))  # of the declared surfaces
        notes["exact_duplicates"] = {k: int(n) for k, n in copies.group_by("source_file").len().iter_rows()}
        rows = rows.with_columns(request_id=first)
    if cfg.time:
        rows, calendar, notes["time_clamped"] = _timed(rows, cfg)
    else:
        if calendar is None:
            raise ValueError("untimed data needs the dataset's calendar.yaml")
        if set(cfg.files) == {"all"}:  # no split files, no time: the seeded per-user rule
            rows = split_by_user(rows, cfg)
        rows = assign_days(rows.with_columns(seconds=pl.lit(NOON)), cfg, calendar)
    return rows.drop([k for k in rows.columns if k.startswith("c:")]), calendar, notes


def write_calendar(dataset: str, home: Path, calendar: CalendarConfig) -> Path:
    """The window a timed dataset's data gives, where the graph reads it (gem_model.config.spec_path)."""
    doc = {"start": calendar.start.isoformat(), "days": calendar.days, "teacher_lag_days": calendar.teacher_lag_days}
    return write_text(home / "imports" / validate_name(dataset, "dataset") / "calendar.yaml",
                      "# written by the import: the data's first to last day (E = the last)\n" + yaml.safe_dump(doc))


def import_spec(
    src: Path, cfg: SourceConfig, surfaces: SurfacesConfig, calendar: CalendarConfig | None, home: Path, dataset: str
) -> ImportResult:
    rows, calendar, notes = read_spec(src, cfg, calendar)
    if cfg.time:
        write_calendar(dataset, home, calendar)
        notes["calendar"] = {"start": calendar.start.isoformat(), "days": calendar.days}
    return write_landing(dataset, src, rows, unclicked_history(rows, cfg), surfaces, calendar, home, notes=notes)

