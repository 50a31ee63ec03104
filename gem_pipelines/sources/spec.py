"""The generic importer: a log described by source.yaml alone (gem_pipelines/sources/layout.py),
landed through the machinery every importer shares (common.py).

A row that cannot be read (wrong field count, invalid UTF-8, an unreadable time or one beyond any
date) lands as text that parses as no record (unparseable); a row of an undeclared surface as a record
of an unknown kind (unknown_enum); a row outside the window (out_of_range_ts); a later exact copy of a
line, with `duplicates: quarantine`, under its first copy's request id (duplicate_record). The row
rules (gem_pipelines/data/normalize.py) decide.

Timed data (`time`): each row's day is its local day (or its day column), the window source.yaml's
bounds, else the data's days (see _window: a few stray times do not stretch it), written to
imports/<dataset>/calendar.yaml, which the graph reads (gem_model.config.spec_path). Untimed data:
the seeded day rule of common.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from gem_model.config import CalendarConfig, SurfacesConfig, validate_name
from gem_model.store.atomic import write_text
from gem_pipelines.data.parsers import split_lines
from gem_pipelines.sources.common import (
    NOON,
    ImportResult,
    SourceConfig,
    apply_purchase_rule,
    assign_days,
    field_at,
    map_surface,
    need_file,
    read_bytes,
    read_rows,
    request_ids,
    source_files,
    split_by_user,
    strip_prefix,
    write_landing,
)
from gem_pipelines.sources.layout import ColumnRef, Read, SideTable, Time, as_column

DAY_S = 86400
LAST_S = DAY_S - 2  # the click lands 1 s after its impression: an impression at most 2 s before midnight
# epoch times beyond 1900-01-01 .. 9999-01-01 are no date (a wrapped int64, ms in a seconds column): unparseable
EPOCH_S = (-2_208_988_800, 253_370_764_800)
PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000}
# without bounds the window is the run of days holding most rows, runs split where no row falls for longer
GAP_DAYS = 30
STRAY_SHARE = 0.01  # more rows than this outside that run: not strays, the window needs first_day / last_day


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
        df = _parquet(path)
        text = {f"c:{c}": pl.col(c).cast(pl.String) for c in _columns(path, df.columns, need, optional)}
        return df.select(
            source_file=pl.lit(path.name), line_no=pl.int_range(1, pl.len() + 1, dtype=pl.Int64),
            raw=pl.struct(pl.all()).struct.json_encode(), ok=pl.lit(True), **text,
        ).with_columns(pl.when(pl.col(c).str.strip_chars() != "").then(pl.col(c)).alias(c) for c in text)
    lines, utf8 = split_lines(read_bytes(path))
    records: list[dict | None] = []
    for line, valid in zip(lines, utf8, strict=True):
        try:
            rec = json.loads(line) if valid else None
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


def _parquet(path: Path) -> pl.DataFrame:
    try:
        return pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ValueError(f"{path}: cannot read the Parquet file: {e}") from e


def _side(path: Path, read: Read) -> pl.DataFrame:
    """A side table as text columns (a real CSV reader: side tables may quote their fields); a table
    that cannot be read (a line with extra fields, invalid UTF-8, no data) is an error naming it."""
    if read.format == "parquet":
        return _parquet(path).with_columns(pl.all().cast(pl.String))
    data = io.BytesIO(read_bytes(path))
    try:
        if read.format == "jsonl":
            return pl.read_ndjson(data).with_columns(pl.all().cast(pl.String))
        return pl.read_csv(data, separator=read.sep, has_header=read.header, infer_schema=False,
                           new_columns=list(read.names) or None)
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{path}: cannot read the side table: {e}") from e


def _one_row_per_key(path: Path, t: SideTable, df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """The side table with exact copies of a row dropped (how many: the import's notes); a key on two
    rows that differ is an error, as no row can be chosen."""
    rows = df.unique(maintain_order=True)
    if (clash := rows.filter(pl.col(t.key).is_duplicated() & pl.col(t.key).is_not_null())).height:
        keys = clash[t.key].unique(maintain_order=True).to_list()
        raise ValueError(f"{path}: key column {t.key!r} holds {len(keys)} value(s) on rows that differ, "
                         f"e.g. {keys[:5]}: a side table needs one row per key")
    return rows, df.height - rows.height


def _read_log(src: Path, cfg: SourceConfig) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The log's rows with the side tables joined (a column name resolves in the log first), and the
    notes: side-table rows dropped as exact copies, log rows whose key a side table lacks (their
    fields from it are null: the constants, or missing_id where an id comes from it)."""
    c, f = cfg.columns, cfg.fields
    assert c is not None
    sides, notes = [], {"side_tables": {}}
    for t in cfg.side_tables:
        path = need_file(src / t.file)
        df = _side(path, t.read)
        if t.key not in df.columns:
            raise ValueError(f"{path}: no key column {t.key!r} (columns: {df.columns})")
        df, copies = _one_row_per_key(path, t, df)
        notes["side_tables"][t.file] = {"rows": df.height, "exact_copies_dropped": copies}
        sides.append((t, df))
    need = [as_column(c.user).column, as_column(c.item).column, c.surface, c.click, c.conversion]
    if cfg.time:
        need += [cfg.time.column, cfg.time.day.column if cfg.time.day else None]
    # the fields' columns: the log's where it has them, else a side table's
    refs = [as_column(f.advertiser_id).column if f.advertiser_id else None, f.user_tenure_days, f.position, f.bid,
            *(as_column(r).column for r in cfg.context.values())]
    rows = pl.concat([read_table(p, cfg.read, [x for x in need if x], [r for r in refs if r]).with_columns(role=pl.lit(role))
                      for role, p in source_files(cfg, src)], how="vertical")
    missing = pl.lit(False)
    for t, df in sides:
        key = as_column(c.user if t.joins == "user" else c.item).column
        side = df.rename({k: f"c:{k}" for k in df.columns if k != t.key})
        side = side.drop([k for k in side.columns if k in rows.columns])  # the log's own column wins
        rows = rows.join(side.with_columns(**{f"_in:{t.file}": True}), left_on=f"c:{key}", right_on=t.key,
                         how="left", maintain_order="left")
        missing = missing | (pl.col(f"c:{key}").is_not_null() & pl.col(f"_in:{t.file}").is_null())
    # per log file (source_accounting shows it beside the file's counts)
    notes["side_key_missing"] = {f: int(n) for f, n in rows.filter(missing).group_by("source_file").len().iter_rows()}
    return rows.drop([k for k in rows.columns if k.startswith("_in:")]), notes if sides else {}


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


def _timed(rows: pl.DataFrame, cfg: SourceConfig, src: Path) -> tuple[pl.DataFrame, CalendarConfig, dict[str, int]]:
    """date and seconds (local wall-clock) of every row, the window, and per file how many mapped rows
    had their time clamped into their day."""
    t = cfg.time
    assert t is not None
    ts = None
    if t.column:
        v = pl.col(f"c:{t.column}")
        if t.unit:
            n = v.cast(pl.Int64, strict=False)
            n = pl.when(n.is_between(EPOCH_S[0] * PER_S[t.unit], EPOCH_S[1] * PER_S[t.unit])).then(n)  # else null
            ts = pl.from_epoch(n, time_unit=t.unit).dt.replace_time_zone("UTC")\
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
    start, end = _window(rows.filter(pl.col("ok") | pl.col("unmapped")), t, src)
    calendar = CalendarConfig(start=start, days=(end - start).days + 1, teacher_lag_days=t.teacher_lag_days)
    # a row outside the window keeps its time and lands on the nearest day of it: out_of_range_ts
    date = pl.col("day").fill_null(start).clip(start, end)
    rows = rows.with_columns(
        date=date, seconds=(pl.col("day").fill_null(start) - date).dt.total_days() * DAY_S + pl.col("_secs").fill_null(NOON)
    )
    return rows.drop("day", "_ts", "_secs"), calendar, clamped


def _window(present: pl.DataFrame, t: Time, where: Path) -> tuple[dt.date, dt.date]:
    """first_day .. last_day; a bound not given comes from the days of the rows within the other. Those
    days are cut into runs wherever no row falls for more than GAP_DAYS days, and the window spans the run
    holding the most rows: a few stray times (epoch 0, a typo'd year) are quarantined out_of_range_ts
    instead of making decades of empty partitions. More than STRAY_SHARE of the rows outside it is an
    error: the data has two periods, and source.yaml must say which window it means."""
    if t.first_day and t.last_day:
        return t.first_day, t.last_day
    inside = present.filter(pl.col("day").is_between(t.first_day or dt.date.min, t.last_day or dt.date.max))
    if inside.is_empty():
        raise ValueError(f"{where}: no readable row with a time in the bounds: the window cannot come from the data")
    days = inside.group_by("day").len().sort("day")
    days = days.with_columns(run=(pl.col("day").diff().dt.total_days() > GAP_DAYS).fill_null(False).cum_sum())
    runs = days.group_by("run").agg(pl.col("len").sum(), lo=pl.col("day").min(), hi=pl.col("day").max())
    best = runs.sort(["len", "lo"], descending=[True, False]).row(0, named=True)
    strays = inside.filter(~pl.col("day").is_between(best["lo"], best["hi"]))
    if strays.height > STRAY_SHARE * inside.height:
        first = strays.sort("day").row(0, named=True)
        raise ValueError(
            f"{where}: {strays.height} of {inside.height} rows lie more than {GAP_DAYS} days from the days "
            f"{best['lo']} .. {best['hi']} that hold most rows (e.g. {first['source_file']} line {first['line_no']}, "
            f"day {first['day']}): set time.first_day / time.last_day in source.yaml to choose the window")
    return t.first_day or best["lo"], t.last_day or best["hi"]


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
    rows, side_notes = _read_log(src, cfg)
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
    notes |= side_notes
    if cfg.duplicates == "quarantine":
        # every copy of a line carries its first copy's id: the row rules file the later ones duplicate_record
        first = pl.col("request_id").first().over("raw")
        copies = rows.filter(pl.col("ok") & (pl.col("request_id") != first))  # of the declared surfaces
        notes["exact_duplicates"] = {k: int(n) for k, n in copies.group_by("source_file").len().iter_rows()}
        rows = rows.with_columns(request_id=first)
    if cfg.time:
        rows, calendar, notes["time_clamped"] = _timed(rows, cfg, src)
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
        notes["calendar"] = {"start": calendar.start.isoformat(), "days": calendar.days}
    result = write_landing(dataset, src, rows, unclicked_history(rows, cfg), surfaces, calendar, home, notes=notes)
    if cfg.time:  # after landing/, which checks its records first: a refused import changes nothing
        write_calendar(dataset, home, calendar)
    return result

