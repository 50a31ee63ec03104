"""The sections of source.yaml that describe a log's layout, read by the generic importer
(gem_pipelines/sources/spec.py): which file format, which column is the user, the item, the
surface, the time and the labels, which side tables join by key, and which landing fields come
from which column. Every model refuses unknown keys; load_source names the file and the key."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import Annotated, Literal

import polars as pl
from pydantic import AfterValidator, Field, field_validator, model_validator

from gem_model.config import _Strict

_COLUMN_RE = re.compile(r"^[A-Za-z0-9_ .:-]{1,128}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]-]*$")


def _column_name(v: str) -> str:
    if not _COLUMN_RE.match(v):
        raise ValueError(f"column {v!r}: expected a column name ([A-Za-z0-9_ .:-], at most 128 characters)")
    return v


def _plain_name(v: str) -> str:
    if not _FILE_RE.match(v) or ".." in v:
        raise ValueError(f"files: {v!r} must be a plain file name or glob (no path, no '..')")
    return v


ColumnName = Annotated[str, AfterValidator(_column_name)]
PlainName = Annotated[str, AfterValidator(_plain_name)]  # a file name or glob of the source dir itself


class Read(_Strict):
    """How a file's rows are read. A `.gz` suffix is decompressed whatever the format."""

    format: Literal["csv", "tsv", "parquet", "jsonl"] = "csv"
    header: bool = True  # csv/tsv: the first line names the columns
    # csv/tsv without a header: the column names, in order (a row with another field count is unparseable)
    names: tuple[ColumnName, ...] = ()

    @model_validator(mode="after")
    def _header_or_names(self) -> Read:
        if self.format in ("csv", "tsv") and not self.header and not self.names:
            raise ValueError("read: a csv/tsv file without a header needs `names`")
        return self

    @property
    def sep(self) -> str:
        return "\t" if self.format == "tsv" else ","


class Column(_Strict):
    """A column's text, optionally cleaned: `U123` -> `123` (strip_prefix), or any text -> a stable
    31-bit id (hash: blake2b, for text ids such as a category name)."""

    column: ColumnName
    strip_prefix: str | None = None  # only when the rest is digits (else the text stays and is quarantined bad_type)
    hash: bool = False


ColumnRef = ColumnName | Column


def as_column(ref: ColumnRef) -> Column:
    return Column(column=ref) if isinstance(ref, str) else ref


class Columns(_Strict):
    """The log's columns by role. Label values are 0/1 text (anything else is quarantined bad_type)."""

    user: ColumnRef
    item: ColumnRef  # the ad of an impression (an item in histories)
    surface: ColumnName  # its values map to surfaces by source.yaml `surfaces`
    click: ColumnName
    conversion: ColumnName | None = None  # the second task's label, where the surfaces log one (tasks: [click, conversion])


class DayColumn(_Strict):
    column: str
    format: str = "%Y-%m-%d"  # strftime


class Time(_Strict):
    """The event time. Times are written as the data's local wall-clock time: the lake's day of a row
    is its local day (`timezone`), and hour_of_day its local hour."""

    column: str | None = None
    unit: Literal["s", "ms", "us"] | None = None  # epoch numbers
    format: str | None = None  # or text times (strftime), read as the data's local time
    timezone: str = "UTC"  # IANA name (Asia/Shanghai) or a fixed offset (+08:00)
    # the row's day from its own column (the app's day): it wins over the time's day, and a time
    # outside that day is clamped into it (counted per file as `time_clamped`)
    day: DayColumn | None = None
    teacher_lag_days: int = Field(default=1, ge=0)
    # optional bounds of the window; rows outside are quarantined out_of_range_ts. Without them the
    # window is the data's first to last day (E = the last day), so a longer copy moves E; a few stray
    # days far from the rest do not count (spec._window)
    first_day: dt.date | None = None
    last_day: dt.date | None = None

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            if not re.match(r"^[+-]\d\d:\d\d$", v):
                zoneinfo.ZoneInfo(v)
            # the reader's own check: polars takes whole-hour offsets up to +-14:00 only (not +99:99, +05:30)
            pl.Series([0], dtype=pl.Datetime("us", "UTC")).dt.convert_time_zone(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, pl.exceptions.PolarsError) as e:
            raise ValueError(f"timezone {v!r}: expected an IANA name (Asia/Shanghai) or a whole-hour offset "
                             f"(+08:00)") from e
        return v

    @model_validator(mode="after")
    def _check(self) -> Time:
        if self.column is None and self.day is None:
            raise ValueError("time: needs `column` (the event time) or `day` (the day column), or both")
        if self.column is not None and (self.unit is None) == (self.format is None):
            raise ValueError("time: give exactly one of `unit` (epoch numbers) or `format` (strftime text)")
        if self.first_day and self.last_day and self.first_day > self.last_day:
            raise ValueError("time: first_day is after last_day")
        return self


class SideTable(_Strict):
    """A table joined to the log by key (user or item features): its columns become usable in `fields`."""

    file: PlainName
    joins: Literal["user", "item"]
    key: ColumnName  # the side table's column holding the user's (item's) id as the log writes it
    read: Read = Read()


class Fields(_Strict):
    """Landing fields the model reads, each from a column of the log or of a side table (null: the
    field's constant, docs/real_data.md). advertiser_id defaults to the item (its own advertiser)."""

    advertiser_id: ColumnRef | None = None
    user_tenure_days: ColumnName | None = None  # dense, >= 0
    position: ColumnName | None = None  # integer >= 1
    bid: ColumnName | None = None  # dense, >= 0

