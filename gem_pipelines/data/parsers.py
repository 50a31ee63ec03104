"""Read one partition's raw files, as each surface emits them, into one *staging* frame.

A staging frame has one row per raw record (a line of a text file, a row of a columnar file),
with every field as text, so a value of the wrong type is still visible to the row-level rules in
`normalize.py` instead of failing the whole file. Only a container-level problem (an unreadable
file, a Parquet file that cannot be opened, a CSV header of another format) raises, naming the file.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import polars as pl

from gem_pipelines.data.formats import LANDING_FILES

FIELDS = (
    "request_id", "ts", "user_id", "device", "user_tenure_days", "ad_id", "advertiser_id",
    "objective", "creative_format", "position", "bid", "click", "click_ts", "conversion",
    "conversion_ts", "item_id", "action",
)  # fmt: skip
# How each format writes timestamps: ISO-8601 text, epoch ms, epoch s (float) or epoch us.
TS_UNIT = {"jsonl_nested": "iso", "csv_ms": "ms", "parquet": "us", "event_stream": "s"}

CSV_IMPRESSION_COLUMNS = {
    "req_id": "request_id", "event_time_ms": "ts", "uid": "user_id", "device_type": "device",
    "tenure_d": "user_tenure_days", "ad": "ad_id", "advertiser": "advertiser_id",
    "objective": "objective", "format": "creative_format", "slot": "position", "bid_usd": "bid",
    "clicked": "click", "click_time_ms": "click_ts", "converted": "conversion",
    "conversion_time_ms": "conversion_ts",
}  # fmt: skip
CSV_ACTIVITY_COLUMNS = {"uid": "user_id", "event_time_ms": "ts", "item": "item_id", "action": "action"}
PARQUET_IMPRESSION_COLUMNS = (
    "request_id", "ts", "user_id", "device", "user_tenure_days", "ad_id", "advertiser_id", "objective",
    "creative_format", "position", "bid", "click", "click_ts", "conversion", "conversion_ts",
)  # fmt: skip
PARQUET_ACTIVITY_COLUMNS = ("user_id", "ts", "item_id", "action")

_S = pl.String
JSONL_NESTED_DTYPE = pl.Struct(
    {
        "kind": _S, "request_id": _S, "ts": _S,
        "user": pl.Struct({"id": _S, "device": _S, "tenure_days": _S}),
        "ad": pl.Struct({"id": _S, "advertiser_id": _S, "objective": _S, "creative_format": _S, "bid": _S}),
        "slot": pl.Struct({"position": _S}),
        "engagement": pl.Struct({"click": _S, "click_ts": _S, "conversion": _S, "conversion_ts": _S}),
        "item_id": _S, "action": _S,
    }
)  # fmt: skip
EVENT_STREAM_DTYPE = pl.Struct(
    {
        "event": _S, "request_id": _S, "ts": _S,
        "payload": pl.Struct(
            {f: _S for f in ("user_id", "device", "tenure_days", "ad_id", "advertiser_id", "objective",
                             "creative_format", "position", "bid", "item_id", "action")}
        ),
    }
)  # fmt: skip


class ContainerError(RuntimeError):
    """A raw file cannot be read at all; the partition fails and the tables keep their version."""


def read_lines(path: Path) -> pl.DataFrame:
    """A text file as (source_file, line_no, raw): one row per line, 1-based, nothing skipped."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ContainerError(f"{path}: cannot read raw file: {e}") from e
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line is not a record
    return pl.DataFrame(
        {
            "source_file": pl.Series([path.name] * len(lines), dtype=pl.String),
            "line_no": pl.Series(range(1, len(lines) + 1), dtype=pl.Int64)
            if lines
            else pl.Series([], dtype=pl.Int64),
            "raw": pl.Series(lines, dtype=pl.String).str.strip_suffix("\r"),
        }
    )


def _decode_json(raw: pl.Series, dtype: pl.Struct) -> tuple[pl.Series, pl.Series]:
    """Decode JSON objects to `dtype`; returns (decoded struct, per-row failure flag).

    Polars decodes a whole column or fails; on failure, bisect to isolate the few rows whose
    nested shape cannot be coerced (e.g. an object where a scalar belongs), so one bad record
    costs O(log n) decodes instead of a per-row Python loop.
    """
    try:
        return raw.str.json_decode(dtype), pl.Series([False] * len(raw), dtype=pl.Boolean)
    except pl.exceptions.PolarsError:
        if len(raw) == 1:
            return pl.Series([None], dtype=dtype), pl.Series([True])
        mid = len(raw) // 2
        a, fa = _decode_json(raw[:mid], dtype)
        b, fb = _decode_json(raw[mid:], dtype)
        return a.append(b), fa.append(fb)


def _json_lines(path: Path, dtype: pl.Struct) -> pl.DataFrame:
    """Lines + decoded struct column `rec` + parse_reason for lines that are not JSON objects."""
    lines = read_lines(path)
    is_object = pl.col("raw").str.json_path_match("$").is_not_null() & pl.col("raw").str.strip_chars().str.starts_with(
        "{"
    )
    lines = lines.with_columns(valid=is_object)
    valid = lines.filter("valid")
    decoded, failed = _decode_json(valid["raw"], dtype)
    valid = valid.with_columns(rec=decoded, decode_failed=failed)
    invalid = lines.filter(~pl.col("valid")).with_columns(
        rec=pl.lit(None, dtype=dtype), decode_failed=pl.lit(False)
    )
    out = pl.concat([valid, invalid]).sort("line_no")
    stripped = pl.col("raw").str.strip_chars()
    return out.with_columns(
        parse_reason=pl.when(~pl.col("valid") & stripped.str.starts_with("{") & ~stripped.str.ends_with("}"))
        .then(pl.lit("truncated"))
        .when(~pl.col("valid"))
        .then(pl.lit("unparseable"))
        .when(pl.col("decode_failed"))
        .then(pl.lit("bad_type"))
    ).drop("valid", "decode_failed")


def _finish(df: pl.DataFrame) -> pl.DataFrame:
    """Add missing staging fields as null text and order the columns."""
    missing = [pl.lit(None, dtype=pl.String).alias(f) for f in FIELDS if f not in df.columns]
    df = df.with_columns(missing)
    empty_to_null = [pl.when(pl.col(f).str.strip_chars() == "").then(None).otherwise(pl.col(f)).alias(f) for f in FIELDS]
    return df.with_columns(empty_to_null).select(
        "source_file", "line_no", "raw", "kind", "parse_reason", *FIELDS
    )


def stage_jsonl_nested(directory: Path) -> pl.DataFrame:
    df = _json_lines(directory / "feed.jsonl", JSONL_NESTED_DTYPE)
    r = pl.col("rec")
    kind = r.struct.field("kind")
    return _finish(
        df.with_columns(
            kind=pl.when(kind == "ad").then(pl.lit("impression")).otherwise(kind),
            request_id=r.struct.field("request_id"),
            ts=r.struct.field("ts"),
            user_id=r.struct.field("user").struct.field("id"),
            device=r.struct.field("user").struct.field("device"),
            user_tenure_days=r.struct.field("user").struct.field("tenure_days"),
            ad_id=r.struct.field("ad").struct.field("id"),
            advertiser_id=r.struct.field("ad").struct.field("advertiser_id"),
            objective=r.struct.field("ad").struct.field("objective"),
            creative_format=r.struct.field("ad").struct.field("creative_format"),
            bid=r.struct.field("ad").struct.field("bid"),
            position=r.struct.field("slot").struct.field("position"),
            click=r.struct.field("engagement").struct.field("click"),
            click_ts=r.struct.field("engagement").struct.field("click_ts"),
            conversion=r.struct.field("engagement").struct.field("conversion"),
            conversion_ts=r.struct.field("engagement").struct.field("conversion_ts"),
            item_id=r.struct.field("item_id"),
            action=r.struct.field("action"),
        ).drop("rec")
    )


def stage_event_stream(directory: Path) -> pl.DataFrame:
    df = _json_lines(directory / "events.jsonl", EVENT_STREAM_DTYPE)
    r = pl.col("rec")
    p = r.struct.field("payload")
    return _finish(
        df.with_columns(
            kind=r.struct.field("event"),
            request_id=r.struct.field("request_id"),
            ts=r.struct.field("ts"),
            user_id=p.struct.field("user_id"),
            device=p.struct.field("device"),
            user_tenure_days=p.struct.field("tenure_days"),
            ad_id=p.struct.field("ad_id"),
            advertiser_id=p.struct.field("advertiser_id"),
            objective=p.struct.field("objective"),
            creative_format=p.struct.field("creative_format"),
            position=p.struct.field("position"),
            bid=p.struct.field("bid"),
            item_id=p.struct.field("item_id"),
            action=p.struct.field("action"),
        ).drop("rec")
    )


def _csv_file(path: Path, columns: dict[str, str], kind: str) -> pl.DataFrame:
    lines = read_lines(path)
    if lines.height == 0:
        raise ContainerError(f"{path}: empty file, expected a header line")
    header = lines["raw"][0].split(",")
    if header != list(columns):
        raise ContainerError(f"{path}: header {header} is not the csv_ms header {list(columns)}")
    body = lines.slice(1)
    n = len(header)
    # Lines with quotes need real CSV parsing; they are rare, so parse them with the csv module.
    quoted = body.filter(pl.col("raw").str.contains('"', literal=True))
    plain = body.filter(~pl.col("raw").str.contains('"', literal=True)).with_columns(
        fields=pl.col("raw").str.split(",")
    )
    if quoted.height:
        parsed = []
        for raw in quoted["raw"]:
            try:
                parsed.append(next(csv.reader(io.StringIO(raw), strict=True), []))
            except csv.Error:
                parsed.append(["<unparseable>"] * (n + 1))
        quoted = quoted.with_columns(fields=pl.Series(parsed, dtype=pl.List(pl.String)))
        plain = pl.concat([plain, quoted]).sort("line_no")
    nf = pl.col("fields").list.len()
    df = plain.with_columns(
        parse_reason=pl.when(pl.col("raw").str.strip_chars() == "")
        .then(pl.lit("unparseable"))
        .when(nf < n)
        .then(pl.lit("truncated"))
        .when(nf > n)
        .then(pl.lit("unparseable")),
        kind=pl.lit(kind),
    )
    ok = pl.col("parse_reason").is_null()
    df = df.with_columns(
        [pl.when(ok).then(pl.col("fields").list.get(i, null_on_oob=True)).alias(dst) for i, dst in enumerate(columns.values())]
    )
    return _finish(df.drop("fields"))


def stage_csv_ms(directory: Path) -> pl.DataFrame:
    return pl.concat(
        [
            _csv_file(directory / "impressions.csv", CSV_IMPRESSION_COLUMNS, "impression"),
            _csv_file(directory / "activity.csv", CSV_ACTIVITY_COLUMNS, "organic"),
        ]
    )


def _parquet_file(path: Path, columns: tuple[str, ...], kind: str) -> pl.DataFrame:
    try:
        df = pl.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - any failure to open the container fails the partition
        raise ContainerError(f"{path}: cannot open Parquet file: {e}") from e
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ContainerError(f"{path}: Parquet file lacks columns {missing}")
    raw = df.select(pl.struct(pl.all()).struct.json_encode().alias("raw"))["raw"]
    as_text = []
    for c in columns:
        dtype = df.schema[c]
        if isinstance(dtype, pl.Datetime):
            as_text.append(pl.col(c).dt.replace_time_zone(None).dt.epoch("us").cast(pl.String).alias(c))
        else:
            as_text.append(pl.col(c).cast(pl.String).alias(c))
    staged = df.select(as_text).with_columns(
        source_file=pl.lit(path.name),
        line_no=pl.int_range(1, df.height + 1, dtype=pl.Int64),
        raw=raw,
        kind=pl.lit(kind),
        parse_reason=pl.lit(None, dtype=pl.String),
    )
    return _finish(staged)


def stage_parquet(directory: Path) -> pl.DataFrame:
    return pl.concat(
        [
            _parquet_file(directory / "impressions.parquet", PARQUET_IMPRESSION_COLUMNS, "impression"),
            _parquet_file(directory / "activity.parquet", PARQUET_ACTIVITY_COLUMNS, "organic"),
        ]
    )


STAGERS: dict[str, Callable[[Path], pl.DataFrame]] = {
    "jsonl_nested": stage_jsonl_nested,
    "csv_ms": stage_csv_ms,
    "parquet": stage_parquet,
    "event_stream": stage_event_stream,
}


def stage_partition(raw_format: str, directory: Path) -> pl.DataFrame:
    """Every raw record of one partition directory as a staging frame."""
    if not directory.is_dir():
        raise ContainerError(f"{directory}: no landing directory for this partition")
    for name in LANDING_FILES[raw_format]:
        if not (directory / name).is_file():
            raise ContainerError(f"{directory / name}: expected raw file of format {raw_format} is missing")
    return STAGERS[raw_format](directory)


def count_raw_records(raw_format: str, directory: Path) -> int:
    """Raw records by counting the files themselves (lines, or Parquet rows): conservation's yardstick."""
    total = 0
    for name in LANDING_FILES[raw_format]:
        path = directory / name
        if name.endswith(".parquet"):
            total += pl.scan_parquet(path).select(pl.len()).collect().item()
        else:
            data = path.read_bytes()
            n = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
            total += n - (1 if name.endswith(".csv") else 0)
    return total
