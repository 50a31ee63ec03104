"""Read one partition's raw files, as each surface emits them, into one *staging* frame.

A staging frame has one row per raw record (a line of a text file, a row of a columnar file),
with every field as text, so a value of the wrong type is still visible to the row-level rules in
`normalize.py` instead of failing the whole file. Only a container-level problem (an unreadable
file, a Parquet file that cannot be opened, a CSV header of another format) raises, naming the file.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from functools import reduce
from pathlib import Path

import polars as pl
import polars.selectors as cs

from gem_pipelines.data.formats import LANDING_FILES, RECORD_FIELDS, path_tree

FIELDS = (*RECORD_FIELDS["parquet"]["impression"], "item_id", "action")  # every field of any record
# How each format writes timestamps: ISO-8601 text, epoch ms, epoch s (float) or epoch us.
TS_UNIT = {"jsonl_nested": "iso", "csv_ms": "ms", "parquet": "us", "event_stream": "s"}


class ContainerError(RuntimeError):
    """A raw file cannot be read at all; the partition fails and the tables keep their version."""


def split_lines(data: bytes) -> tuple[list[str], list[bool]]:
    """A text file's lines (without the empty one after a final newline) and whether each is valid UTF-8. A line
    that is not keeps its bad bytes as \\x escapes and must be quarantined: replacing them by U+FFFD would make
    distinct ids equal. The importer (gem_pipelines.sources) reads its source files the same way."""
    try:
        lines, utf8 = data.decode("utf-8").split("\n"), None
    except UnicodeDecodeError:  # rare: decode line by line (b"\n" never occurs inside a UTF-8 sequence)
        lines, utf8 = [], []
        for line in data.split(b"\n"):
            try:
                lines.append(line.decode("utf-8"))
                utf8.append(True)
            except UnicodeDecodeError:
                lines.append(line.decode("utf-8", errors="backslashreplace"))
                utf8.append(False)
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line is not a record
    return lines, utf8[: len(lines)] if utf8 is not None else [True] * len(lines)


def read_lines(path: Path) -> pl.DataFrame:
    """A text file as (source_file, line_no, raw, utf8): one row per line, 1-based, nothing skipped; `utf8` false
    for a line that is not valid UTF-8 (see split_lines: the parsers quarantine it)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ContainerError(f"{path}: cannot read raw file: {e}") from e
    lines, utf8 = split_lines(data)
    return pl.DataFrame({"raw": pl.Series(lines, dtype=pl.String)}).select(
        source_file=pl.lit(path.name),
        line_no=pl.int_range(1, pl.len() + 1, dtype=pl.Int64),
        raw=pl.col("raw").str.strip_suffix("\r"),
        utf8=pl.Series(utf8, dtype=pl.Boolean),
    )


def _decode_json(raw: pl.Series, dtype: pl.Struct) -> tuple[pl.Series, pl.Series]:
    """(decoded struct, per-row failure flag). Polars decodes a whole column or fails, so bisect to the rows whose
    shape cannot be coerced (an object where a scalar belongs): O(log n) decodes per bad record, no row loop."""
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
    stripped = pl.col("raw").str.strip_chars()
    lines = read_lines(path).with_columns(
        valid=pl.col("utf8") & pl.col("raw").str.json_path_match("$").is_not_null() & stripped.str.starts_with("{")
    )
    valid = lines.filter("valid")
    decoded, failed = _decode_json(valid["raw"], dtype)
    valid = valid.with_columns(rec=decoded, decode_failed=failed)
    invalid = lines.filter(~pl.col("valid")).with_columns(rec=pl.lit(None, dtype=dtype), decode_failed=pl.lit(False))
    out = pl.concat([valid, invalid]).sort("line_no")
    return out.with_columns(
        parse_reason=pl.when(~pl.col("utf8"))
        .then(pl.lit("unparseable"))
        .when(~pl.col("valid") & stripped.str.starts_with("{") & ~stripped.str.ends_with("}"))
        .then(pl.lit("truncated"))
        .when(~pl.col("valid"))
        .then(pl.lit("unparseable"))
        .when(pl.col("decode_failed"))
        .then(pl.lit("bad_type"))
    ).drop("valid", "decode_failed")


def _finish(df: pl.DataFrame, context: Sequence[str] = ()) -> pl.DataFrame:
    """Add missing staging fields as null text and order the columns (the context fields last, each as
    `context.<name>`: no clash with a staging field)."""
    fields = (*FIELDS, *(f"context.{name}" for name in context))
    missing = [pl.lit(None, dtype=pl.String).alias(f) for f in fields if f not in df.columns]
    df = df.with_columns(missing)
    empty_to_null = [pl.when(pl.col(f).str.strip_chars() == "").then(None).otherwise(pl.col(f)).alias(f) for f in fields]
    return df.with_columns(empty_to_null).select(
        "source_file", "line_no", "raw", "kind", "parse_reason", *fields
    )


def _json_struct(tree: dict[str, object]) -> pl.Struct:
    """Every field of the format's records as text (a value of another type is cast, or fails the row)."""
    return pl.Struct({k: _json_struct(v) if isinstance(v, dict) else pl.String for k, v in tree.items()})  # type: ignore[arg-type]


def _stage_json(raw_format: str, directory: Path, context: Sequence[str] = ()) -> pl.DataFrame:
    fields = {**RECORD_FIELDS[raw_format]["impression"], **RECORD_FIELDS[raw_format]["organic"],
              **{f"context.{name}": ("context", name) for name in context}}
    df = _json_lines(directory / LANDING_FILES[raw_format][0], _json_struct(path_tree(fields)))
    columns = {name: reduce(lambda e, key: e.struct.field(key), path, pl.col("rec")) for name, path in fields.items()}
    kind = columns.pop("kind")
    if raw_format == "jsonl_nested":  # its impressions are records of kind "ad"
        kind = pl.when(kind == "ad").then(pl.lit("impression")).otherwise(kind)
    return _finish(df.with_columns(kind=kind, **columns).drop("rec"), context)


def _csv_file(path: Path, fields: dict[str, tuple[str, ...]], kind: str) -> pl.DataFrame:
    columns = {column: name for name, (column,) in fields.items()}
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
        parse_reason=pl.when(~pl.col("utf8") | (pl.col("raw").str.strip_chars() == ""))
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


def _parquet_file(path: Path, fields: dict[str, tuple[str, ...]], kind: str) -> pl.DataFrame:
    columns = [column for (column,) in fields.values()]
    try:
        df = pl.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - any failure to open the container fails the partition
        raise ContainerError(f"{path}: cannot open Parquet file: {e}") from e
    if missing := [c for c in columns if c not in df.columns]:
        raise ContainerError(f"{path}: Parquet file lacks columns {missing}")
    raw = df.select(pl.struct(pl.all()).struct.json_encode().alias("raw"))["raw"]
    as_text = df.select(columns).with_columns(  # timestamps as epoch microseconds, as the format stores them
        cs.datetime().dt.replace_time_zone(None).dt.epoch("us")).cast(pl.String)
    staged = as_text.with_columns(
        source_file=pl.lit(path.name),
        line_no=pl.int_range(1, df.height + 1, dtype=pl.Int64),
        raw=raw,
        kind=pl.lit(kind),
        parse_reason=pl.lit(None, dtype=pl.String),
    )
    return _finish(staged)


def stage_partition(raw_format: str, directory: Path, context: Sequence[str] = ()) -> pl.DataFrame:
    """Every raw record of one partition directory as a staging frame; `context`: the dataset's own log
    columns (features.yaml `context: true`), which only the jsonl_nested landing of an import carries."""
    if context and raw_format != "jsonl_nested":
        raise ValueError(f"context columns {list(context)}: only the jsonl_nested landing carries them, not {raw_format}")
    if not directory.is_dir():
        raise ContainerError(f"{directory}: no landing directory for this partition")
    for name in LANDING_FILES[raw_format]:
        if not (directory / name).is_file():
            raise ContainerError(f"{directory / name}: expected raw file of format {raw_format} is missing")
    if raw_format in ("jsonl_nested", "event_stream"):
        return _stage_json(raw_format, directory, context)
    read = _csv_file if raw_format == "csv_ms" else _parquet_file
    kinds = ("impression", "organic")  # the order of the format's files
    return pl.concat(
        [
            read(directory / name, RECORD_FIELDS[raw_format][kind], kind)
            for name, kind in zip(LANDING_FILES[raw_format], kinds, strict=True)
        ]
    )


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
