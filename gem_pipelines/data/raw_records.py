"""Raw records of one simulated partition in its surface's native format (`gem_pipelines.data.formats`),
corrupted realistically, and written atomically.

`build` lays the clean frames of `simulator.simulate_day_frames` out as the format's records, `corrupt` injects
`corruption_rate` of them with one quarantine reason each (`applicable_reasons`: what the format can
carry; extra records for duplicates and orphan events), `serialise` turns them into file bytes and
`write_atomic` replaces the partition's landing folder with them.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from gem_model.config import Surface
from gem_model.store.atomic import write_bytes
from gem_pipelines.data import formats as F

DAY_MS = 86_400_000


def day0_ms(date: dt.date) -> int:
    """Epoch milliseconds of the day's UTC midnight."""
    return (date - dt.date(1970, 1, 1)).days * DAY_MS


_IN_PLACE = ("unparseable", "truncated", "missing_id", "bad_type", "out_of_range_value", "out_of_range_ts",
             "unknown_enum")  # fmt: skip
_UNKNOWN_ENUMS = {"objective": "brand_lift", "creative_format": "hologram", "device": "smart_fridge",
                  "action": "poke"}  # fmt: skip
_GARBAGE = ("<html><body><h1>502 Bad Gateway</h1></body></html>", "ERROR upstream timeout (retry 3/3)",
            "\\x00\\x00\\x1f\\x8b garbage", "null null null")  # fmt: skip


def applicable_reasons(surface: Surface) -> tuple[str, ...]:
    """Quarantine reasons the simulator injects for this surface (a subset of formats.REASON_CODES)."""
    if surface.format == "parquet":  # columnar: rows always parse and are typed
        out = ["missing_id", "out_of_range_value", "out_of_range_ts", "unknown_enum", "duplicate_record"]
    else:
        out = list(_IN_PLACE) + ["duplicate_record"]
    if surface.format == "event_stream":
        out.append("orphan_event")
    if "conversion" not in surface.tasks:
        out.append("unexpected_label")
    return tuple(out)


def _iso(expr: pl.Expr) -> pl.Expr:
    return expr.dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")


def _epoch_s(expr: pl.Expr) -> pl.Expr:
    return (expr.dt.epoch("ms") / 1000.0).round(3)


def _ms(expr: pl.Expr) -> pl.Expr:
    return expr.dt.epoch("ms")


def _iso_from_ms(ms: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _ms_from_iso(s: str) -> int:
    t = dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    return round(t.timestamp() * 1000)


# a record's time as each format writes it: (epoch ms of the written value, written value of epoch ms)
_TS_CODECS = {
    "jsonl_nested": (_ms_from_iso, _iso_from_ms),
    "event_stream": (lambda v: round(float(v) * 1000), lambda ms: ms / 1000.0),
    "csv_ms": (int, lambda ms: ms),
    "parquet": (lambda v: int(v) // 1000, lambda ms: ms * 1000),  # epoch microseconds
}


@dataclass
class _Doc:
    """The raw records of one partition, before serialisation; what corruption operates on.

    `files[f]` is a list of records (text lines, or row indices into `cols[f]` for parquet);
    `kinds[f][i]` is "imp" (impression, corruptible in place), "imp_ev" (event_stream impression
    with click/conversion events: never corrupted in place, so no events are orphaned), "org",
    "click" or "conv"; `ts_ms[f][i]` its time.
    """

    names: list[str]
    files: list[list]
    kinds: list[list[str]]
    ts_ms: list[list[int]]
    rids: list[list[str | None]]
    headers: list[str | None]
    cols: list[dict[str, list]] | None = None


_JSON_FORMATS = ("jsonl_nested", "event_stream")
_DELETE = object()  # remove the field (JSON) / leave it empty (CSV) / null (parquet)


class _Rec:
    """One record opened for mutation, addressed by staging field names (formats.RECORD_FIELDS)."""

    def __init__(self, doc: _Doc, fmt: str, f: int, i: int):
        self.doc, self.fmt, self.f, self.i = doc, fmt, f, i
        self.kind = "imp" if doc.kinds[f][i] in ("imp", "imp_ev") else doc.kinds[f][i]
        self.fields = F.RECORD_FIELDS[fmt]["impression" if self.kind == "imp" else "organic"]
        if fmt in _JSON_FORMATS:
            self.obj = json.loads(doc.files[f][i])
        elif fmt == "csv_ms":
            self.obj = dict(zip(doc.headers[f].split(","), doc.files[f][i].split(","), strict=True))
        else:
            self.obj = {c: v[doc.files[f][i]] for c, v in doc.cols[f].items()}

    def has(self, field: str) -> bool:
        return field in self.fields

    def get(self, field: str):
        d = self.obj
        for k in self.fields[field]:
            d = d.get(k) if isinstance(d, dict) else None
        return d

    def set(self, field: str, value) -> None:
        *parents, key = self.fields[field]
        d = self.obj
        for k in parents:
            d = d[k]
        if value is _DELETE and self.fmt in _JSON_FORMATS:
            d.pop(key, None)
        elif self.fmt == "csv_ms":  # text, empty for null
            value = int(value) if isinstance(value, bool) else value
            d[key] = "" if value is _DELETE or value is None else str(value)
        else:
            d[key] = None if value is _DELETE else value

    def get_ms(self, field: str) -> int | None:
        v = self.get(field)
        return None if v is None or v == "" else _TS_CODECS[self.fmt][0](v)

    def set_ms(self, field: str, ms: int) -> None:
        self.set(field, _TS_CODECS[self.fmt][1](ms))

    def dump(self) -> None:
        if self.fmt in _JSON_FORMATS:
            self.doc.files[self.f][self.i] = json.dumps(self.obj, separators=(",", ":"))
        elif self.fmt == "csv_ms":
            self.doc.files[self.f][self.i] = ",".join(self.obj.values())
        else:
            row = self.doc.files[self.f][self.i]
            for c, v in self.obj.items():
                self.doc.cols[self.f][c][row] = v


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


# reason -> ((field, value) choices for an organic record, the same for an impression)
_FIELD_VALUES = {
    "missing_id": ([("user_id", None), ("item_id", _DELETE), ("item_id", None)],
                   [("request_id", ""), ("request_id", _DELETE), ("user_id", None), ("ad_id", _DELETE),
                    ("advertiser_id", None)]),
    "bad_type": ([("item_id", "12a"), ("user_id", "user-17")], [("bid", "abc"), ("position", "2.5x"), ("position", 2.5)]),
}  # fmt: skip


def _mutate(rec: _Rec, reason: str, rng: np.random.Generator) -> None:
    """Apply one in-place corruption (other than unparseable/truncated) to a parsed record."""
    imp = rec.kind == "imp"
    if reason in _FIELD_VALUES:
        field, value = _pick(rng, _FIELD_VALUES[reason][imp])
        if reason == "missing_id" and rec.fmt == "parquet" and field == "request_id":
            value = _pick(rng, ["", None])
        rec.set(field, value)
    elif reason == "out_of_range_value":
        field = "bid" if rng.random() < 0.75 else "user_tenure_days"
        v = float(rec.get(field))
        rec.set(field, -round(abs(v) + 0.5, 4))
    elif reason == "out_of_range_ts":
        shift = int(_pick(rng, [-3, -2, -1, 1, 2, 3])) * DAY_MS
        for field in ("ts", "click_ts", "conversion_ts"):
            if rec.has(field) and (ms := rec.get_ms(field)) is not None:
                rec.set_ms(field, ms + shift)
    elif reason == "unknown_enum":
        field = _pick(rng, ["objective", "creative_format", "device"]) if imp else "action"
        rec.set(field, _UNKNOWN_ENUMS[field])
    else:  # unexpected_label: a conversion on a surface that does not log conversions
        rec.set("conversion", True)
        base = rec.get_ms("click_ts") or rec.get_ms("ts")
        rec.set_ms("conversion_ts", base + 900_000)
    rec.dump()


def _truncate(line: str, fmt: str, rng: np.random.Generator) -> str:
    if fmt == "csv_ms":  # cut before the last delimiter: fewer fields than the header
        last = line.rfind(",")
        return line[: int(rng.integers(max(1, last // 3), last))]
    for _ in range(100):
        cut = int(rng.integers(len(line) // 4, len(line) - 1))
        if line[cut - 1] not in "}":
            return line[:cut]
    return line[: len(line) // 2] + '"'


def _unparseable(line: str, fmt: str, rng: np.random.Generator) -> str:
    if fmt == "csv_ms":  # an unescaped delimiter: more fields than the header
        fields = line.split(",")
        k = int(rng.integers(len(fields)))
        fields[k] = fields[k] + "," + _pick(rng, ["desktop", "n/a", "1;2", "x"])
        return ",".join(fields)
    choice = int(rng.integers(3))
    if choice == 0:  # broken quoting: drop a quote in the middle
        quotes = [k for k, c in enumerate(line) if c == '"']
        k = quotes[int(rng.integers(1, len(quotes) - 1))]
        out = line[:k] + line[k + 1 :]
    elif choice == 1:  # a key/value separator mangled
        colons = [k for k, c in enumerate(line) if c == ":" and line[k - 1] == '"']
        k = colons[int(rng.integers(len(colons)))]
        out = line[:k] + "=" + line[k + 1 :]
    else:  # not JSON at all (tagged so that two garbage lines are not copies of each other)
        out = f"{_pick(rng, _GARBAGE)} [{int(rng.integers(1 << 40)):x}]"
    try:
        json.loads(out)
    except ValueError:
        return out
    return f"{_GARBAGE[0]} [{int(rng.integers(1 << 40)):x}]"  # pragma: no cover


def _plan(rng: np.random.Generator, n_records: int, reasons: tuple[str, ...], rate: float) -> dict[str, int]:
    counts = dict.fromkeys(reasons, 0)
    if rate <= 0 or not reasons or n_records == 0:
        return counts
    k = int(rng.binomial(n_records, rate))
    if n_records >= 1000:  # every reason at least once, so quarantine is always exercised
        counts = dict.fromkeys(reasons, 1)
        k = max(0, k - len(reasons))
    for j in rng.integers(0, len(reasons), k):
        counts[reasons[int(j)]] += 1
    return counts


def corrupt(doc: _Doc, surf: Surface, date: dt.date, n_imp: int, rate: float, rng: np.random.Generator
             ) -> dict[str, int]:  # fmt: skip
    """Corrupt `doc` in place; extra records are inserted. Returns reason -> injected count."""
    fmt = surf.format
    reasons = applicable_reasons(surf)
    n_records = sum(len(f) for f in doc.files)
    counts = _plan(rng, n_records, reasons, rate)
    if not any(counts.values()):
        return counts
    file_of = np.concatenate([np.full(len(ks), f) for f, ks in enumerate(doc.kinds)])
    index_of = np.concatenate([np.arange(len(ks)) for ks in doc.kinds])
    kind_of = np.concatenate([np.asarray(ks, dtype=object) for ks in doc.kinds])
    pools: dict[tuple[str, ...], np.ndarray] = {}
    used: set[int] = set()

    def take(kinds: tuple[str, ...]) -> tuple[int, int] | None:
        if kinds not in pools:
            pools[kinds] = np.flatnonzero(np.isin(kind_of, kinds))
        pool = pools[kinds]
        if not len(pool):
            return None
        for _ in range(1000):
            if (j := int(pool[int(rng.integers(len(pool)))])) not in used:
                used.add(j)
                return int(file_of[j]), int(index_of[j])
        return None

    injected = dict.fromkeys(reasons, 0)
    extras: list[tuple[int, float, object]] = []  # (file, position key, record)
    for reason in reasons:
        in_place = reason in _IN_PLACE or (reason == "unexpected_label" and fmt != "event_stream")
        if in_place:  # the kinds of record the reason applies to
            kinds = ("imp",) if reason in ("out_of_range_value", "unexpected_label") else ("imp", "org")
        else:
            kinds = {"duplicate_record": ("imp", "imp_ev", "org", "click", "conv"), "orphan_event": ()}.get(
                reason, ("imp", "imp_ev"))  # fmt: skip
        for _ in range(counts[reason]):
            if (at := take(kinds) if kinds else (0, 0)) is None:  # an orphan event is a new record
                continue
            f, i = at
            if reason == "truncated":
                doc.files[f][i] = _truncate(doc.files[f][i], fmt, rng)
            elif reason == "unparseable":
                doc.files[f][i] = _unparseable(doc.files[f][i], fmt, rng)
            elif in_place:
                _mutate(_Rec(doc, fmt, f, i), reason, rng)
            elif reason == "duplicate_record":  # an exact later copy
                pos = min(i + 1 + int(rng.integers(0, 200)), len(doc.files[f])) - 0.5
                extras.append((f, pos, doc.files[f][i]))  # a line, or (parquet) the row index again
            else:  # orphan_event, or event_stream's unexpected_label: an extra event
                if reason == "orphan_event":
                    rid = f"{surf.name}-{date:%Y%m%d}-{n_imp + 1 + injected[reason]:07d}"
                    ms = day0_ms(date) + int(rng.integers(0, DAY_MS))
                    event = _pick(rng, ["click", "click", "conversion"] if "conversion" in surf.tasks
                                  else ["click"])  # fmt: skip
                else:
                    rid, ms = doc.rids[f][i], doc.ts_ms[f][i] + int(rng.integers(60_000, 3_600_000))
                    event = "conversion"
                line = json.dumps(
                    {"event": event, "request_id": rid, "ts": ms / 1000.0}, separators=(",", ":")
                )
                pos = float(np.searchsorted(np.asarray(doc.ts_ms[0]), ms, side="right")) - 0.5
                extras.append((0, pos, line))
            injected[reason] += 1
    for f in range(len(doc.files)):  # extras sit at half positions, records at whole ones: sort them together
        if mine := [(pos, seq, rec) for seq, (ff, pos, rec) in enumerate(extras, 1) if ff == f]:
            merged = sorted([(i, 0, rec) for i, rec in enumerate(doc.files[f])] + mine, key=lambda t: t[:2])
            doc.files[f] = [rec for _, _, rec in merged]
    return injected


def _lines(df: pl.DataFrame, kind: pl.Expr, ts: pl.Expr, rid: pl.Expr, record: pl.Expr) -> pl.DataFrame:
    return df.select(
        ts.alias("ts_ms"),
        kind.alias("kind"),
        rid.cast(pl.String).alias("rid"),
        record.struct.json_encode().alias("line"),
    )


_WRITE_TS = {"jsonl_nested": _iso, "event_stream": _epoch_s, "csv_ms": _ms, "parquet": lambda e: e}


def _values(fmt: str, kind: str, label: str | None = None) -> dict[str, pl.Expr]:
    """Each field of `kind` records (formats.RECORD_FIELDS) as `fmt` writes it; `label`: their kind field."""
    out = {}
    for name in F.RECORD_FIELDS[fmt][kind]:
        e = pl.col(name)
        if name == "kind":
            e = pl.lit(label)
        elif name == "ts" or name.endswith("_ts"):
            e = _WRITE_TS[fmt](e)
        elif name in ("click", "conversion") and fmt != "csv_ms":  # CSV writes 0/1
            e = e.cast(pl.Boolean)
        out[name] = e
    return out


def _record(fmt: str, kind: str, label: str) -> pl.Expr:
    """A JSON format's record: its fields' values nested at their paths."""
    values = _values(fmt, kind, label)

    def nest(tree: dict) -> pl.Expr:
        return pl.struct(*((nest(v) if isinstance(v, dict) else values[v]).alias(k) for k, v in tree.items()))

    return nest(F.path_tree(F.RECORD_FIELDS[fmt][kind]))


def _build_json(fmt: str, imp: pl.DataFrame, org: pl.DataFrame) -> _Doc:
    c, stream = pl.col, fmt == "event_stream"
    has_events = pl.lit(stream) & ((c.click == 1) | (c.conversion == 1).fill_null(False))
    imp_kind = pl.when(has_events).then(pl.lit("imp_ev")).otherwise(pl.lit("imp"))  # see _Doc
    impression = _record(fmt, "impression", "impression" if stream else "ad")
    parts = [_lines(imp, imp_kind, _ms(c.ts), c.request_id, impression)]
    for label, kind in (("click", "click"), ("conversion", "conv")) if stream else ():
        sub = imp.filter(pl.col(label) == 1)
        event = pl.struct(
            pl.lit(label).alias("event"), c.request_id, _epoch_s(pl.col(f"{label}_ts")).alias("ts")
        )
        parts.append(_lines(sub, pl.lit(kind), _ms(pl.col(f"{label}_ts")), c.request_id, event))
    parts.append(_lines(org, pl.lit("org"), _ms(c.ts), pl.lit(None), _record(fmt, "organic", "organic")))
    df = pl.concat(parts).sort("ts_ms", maintain_order=True)
    return _Doc([F.LANDING_FILES[fmt][0]], [df["line"].to_list()], [df["kind"].to_list()], [df["ts_ms"].to_list()],
                [df["rid"].to_list()], [None])  # fmt: skip


def _build_flat(fmt: str, imp: pl.DataFrame, org: pl.DataFrame) -> _Doc:
    """csv_ms: lines of text; parquet: rows of columns (timestamps as epoch us while mutating)."""
    doc = _Doc(list(F.LANDING_FILES[fmt]), [], [], [], [], [], [] if fmt == "parquet" else None)
    for df, kind, short in ((imp, "impression", "imp"), (org, "organic", "org")):
        fields = F.RECORD_FIELDS[fmt][kind]
        values = _values(fmt, kind).values()
        df = df.select(**{loc: e for (loc,), e in zip(fields.values(), values, strict=True)})
        if doc.cols is None:
            text = df.write_csv(null_value="", line_terminator="\n")
            header, *lines = text.rstrip("\n").split("\n")
            doc.files.append(lines)
            doc.headers.append(header)
            doc.ts_ms.append(df[fields["ts"][0]].to_list())
        else:
            df = df.with_columns(pl.col(pl.Datetime).dt.epoch("us"))
            doc.cols.append(df.to_dict(as_series=False))
            doc.files.append(list(range(len(df))))
            doc.headers.append(None)
            doc.ts_ms.append([v // 1000 for v in doc.cols[-1]["ts"]])
        doc.kinds.append([short] * len(df))
        doc.rids.append(df[fields["request_id"][0]].to_list() if kind == "impression" else [None] * len(df))
    return doc


# the lake's types, with the 0/1 labels (Int8) as booleans
_ARROW = {pl.String: pa.string(), pl.Int64: pa.int64(), pl.Int32: pa.int32(), pl.Float64: pa.float64(),
          pl.Int8: pa.bool_(), F.UTC_US: pa.timestamp("us", "UTC")}  # fmt: skip
_PARQUET_SCHEMAS = {
    name: pa.schema([(c, _ARROW[schema[c]]) for c in F.RECORD_FIELDS["parquet"][kind]])
    for name, kind, schema in (("impressions.parquet", "impression", F.EVENTS_SCHEMA),
                               ("activity.parquet", "organic", F.USER_ACTIVITY_SCHEMA))
}  # fmt: skip


def serialise(doc: _Doc) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for f, name in enumerate(doc.names):
        if doc.cols is None:
            lines = ([doc.headers[f]] if doc.headers[f] is not None else []) + doc.files[f]
            out[name] = ("\n".join(lines) + "\n").encode() if lines else b""
            continue
        schema, cols, rows = _PARQUET_SCHEMAS[name], doc.cols[f], doc.files[f]
        arrays = [  # timestamps are epoch us while mutating
            pa.array(
                [cols[c.name][r] for r in rows], pa.int64() if pa.types.is_timestamp(c.type) else c.type
            ).cast(c.type)
            for c in schema
        ]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), sink, compression="zstd")
        out[name] = sink.getvalue().to_pybytes()
    return out


def write_atomic(directory: Path, blobs: dict[str, bytes]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [write_bytes(directory / name, data) for name, data in blobs.items()]
    for stale in directory.iterdir():  # leftovers of an earlier simulation of this partition
        if stale.name not in blobs and stale.is_file():
            stale.unlink()
    return paths


def build(fmt: str, imp: pl.DataFrame, org: pl.DataFrame) -> _Doc:
    """The clean impressions and organic activity of a partition as the records of format `fmt`."""
    return (_build_json if fmt in _JSON_FORMATS else _build_flat)(fmt, imp, org)
