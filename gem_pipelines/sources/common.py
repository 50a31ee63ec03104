"""What every importer shares: its config (assets/sources/<name>/source.yaml), reading the source
rows, the split of rows onto the calendar's days, and writing `landing/` in the jsonl_nested format.

A mapped row lands with its fields as source text, so a bad value reaches the unchanged row rules
(gem_pipelines/data/normalize.py) and is quarantined there with its code; a row that cannot be
mapped lands verbatim (unparseable). Nothing is dropped: `imports/<dataset>/lineage.parquet` maps
every landing line back to (source file, line).
"""

from __future__ import annotations

import codecs
import datetime as dt
import gzip
import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import polars as pl
from pydantic import AfterValidator, Field, model_validator

from gem_model.config import (
    REPO_ROOT,
    SOURCES_DIR,
    CalendarConfig,
    ConfigError,
    Name,
    SurfacesConfig,
    _load,
    _Strict,
    env,
    load_surfaces,
    validate_name,
)
from gem_model.store.atomic import atomic_path, write_json, write_text
from gem_pipelines.data.parsers import split_lines
from gem_pipelines.sources.layout import ColumnRef, Columns, Fields, PlainName, Read, SideTable, Time

FEED = "feed.jsonl"  # every imported surface uses the jsonl_nested format
PURCHASE_WITHOUT_CLICK = "purchase_without_click"  # the import's note: rows the rule applied to
# Ads fields the public datasets do not have: constants from the closed vocabularies, documented in
# docs/real_data.md. They carry no signal, so the model learns nothing from them.
DEVICE, OBJECTIVE, CREATIVE_FORMAT, POSITION, BID, TENURE = "web", "traffic", "image", "1", "0.0", "0.0"
NOON = 12 * 3600  # datasets without time: every impression of day D at D 12:00:00Z (see split rules)
# lands before a row that could not be read and would otherwise parse as a JSON record of its own:
# the parsers see no JSON and quarantine it `unparseable` (other such rows land verbatim)
UNPARSEABLE = "unparseable: "
CLICK_DELAY_S = 1  # a click (and a conversion) is stamped 1 s after its impression


class _Shares(_Strict):
    @model_validator(mode="after")
    def _sum(self) -> _Shares:
        if abs(sum(self.model_dump().values()) - 1.0) > 1e-6:
            raise ValueError(" + ".join(type(self).model_fields) + " must sum to 1")
        return self


class TrainDays(_Shares):
    """How the train role is spread over the days before validation."""

    warmup: float = Field(default=0.1, ge=0, le=1)  # histories only: no model trains on the first day
    teacher: float = Field(default=0.75, ge=0, le=1)  # spread evenly over the teacher's days
    student_only: float = Field(default=0.15, ge=0, le=1)  # days only the students see (teacher lag)


class UserSplit(_Shares):
    """Datasets without their own split files: users are assigned to a role by a seeded hash."""

    train: float = Field(default=0.8, ge=0, le=1)
    val: float = Field(default=0.1, ge=0, le=1)
    test: float = Field(default=0.1, ge=0, le=1)


SurfaceName = Annotated[str, AfterValidator(lambda v: validate_name(v, "surface"))]


def _relative(value: str) -> str:
    if not value or Path(value).is_absolute() or value.startswith("~"):
        raise ValueError(f"{value!r} must be a folder relative to the repository (an absolute one: GEM_SOURCE_DIR)")
    return value


RelativeDir = Annotated[str, AfterValidator(_relative)]


class SourceConfig(_Strict):
    # spec: the generic importer reads the layout below (gem_pipelines/sources/spec.py); the others
    # are modules for layouts a spec cannot express (docs/real_data.md says why)
    importer: Literal["spec", "taobao", "aliccp", "mind_tsv"] = "spec"
    default_dir: RelativeDir  # relative to the repo root (the shared samples); GEM_SOURCE_DIR overrides it
    # role (train | val | test | all) -> file names or globs in the source dir. Timed data: `all`
    # (the time decides the day); untimed: split files by role, or `all` with the per-user split
    files: dict[Literal["train", "val", "test", "all"], tuple[PlainName, ...]]
    read: Read = Read()
    columns: Columns | None = None  # required by importer: spec
    time: Time | None = None  # None: no time in the data (the seeded day rule of docs/real_data.md)
    side_tables: tuple[SideTable, ...] = ()
    fields: Fields = Fields()
    # the log's own columns the model reads (each declared in the dataset's features.yaml with `context: true`,
    # which gives its kind): features.yaml name -> the column of the log or of a side table
    context: dict[Name, ColumnRef] = {}
    # quarantine: a later exact copy of a line (same text) is the same impression logged twice, filed
    # as duplicate_record; keep: every line is its own impression
    duplicates: Literal["keep", "quarantine"] = "keep"
    seed: int = 0
    surfaces: dict[str, SurfaceName] = Field(min_length=1)  # raw value of the dataset's surface column -> surface name
    train_days: TrainDays = TrainDays()
    user_split: UserSplit = UserSplit()
    # surface -> share of its val rows moved to the train days
    val_to_train: dict[SurfaceName, Annotated[float, Field(ge=0, lt=1)]] = {}
    # a purchase with click 0 (Ali-CCP): drop_purchase (conversion 0, counted) | keep (a view-through
    # conversion, counted); None: labels as they are, nothing counted
    purchase_without_click: Literal["drop_purchase", "keep"] | None = None
    peer_ne: dict[str, float] = {}  # surface -> test click NE of public peer models (targets, not ours)
    news: tuple[PlainName, ...] = ()  # MIND original layout: the news.tsv files (news id -> category, subcategory)
    common: tuple[PlainName, ...] = ()  # Ali-CCP Tianchi layout: the common_features files (md5 -> user features)
    # Douban: a rated item labelled negative was still consumed; `view` also writes it as the user's organic
    # `view` at the impression's time (later histories hold what the user rated low). None: clicks only.
    unclicked_as: Literal["view"] | None = None

    @model_validator(mode="after")
    def _spec(self) -> SourceConfig:
        if self.importer == "spec" and self.columns is None:
            raise ValueError("columns: the generic importer (importer: spec) needs the log's columns")
        if self.context and self.importer != "spec":
            raise ValueError(f"context: only the generic importer (importer: spec) lands context columns, not {self.importer}")
        if self.time is not None and set(self.files) != {"all"}:
            raise ValueError("files: timed data lists its files under `all` (the time decides each row's day)")
        return self


def load_source(name: str) -> SourceConfig:
    """assets/sources/<name>/source.yaml, its surface names checked against the dataset's surfaces.yaml."""
    validate_name(name, "dataset")
    path = SOURCES_DIR / name / "source.yaml"
    cfg = _load(SourceConfig, path)
    if (SOURCES_DIR / name / "surfaces.yaml").is_file():
        check_surfaces(cfg, load_surfaces(SOURCES_DIR / name / "surfaces.yaml"), path)
    return cfg


def check_surfaces(cfg: SourceConfig, surfaces: SurfacesConfig, where: Path | str) -> None:
    """Every surface source.yaml names (`surfaces` values, `val_to_train` and `peer_ne` keys) is declared
    in the dataset's surfaces.yaml: a typo would land rows in no partition."""
    declared = set(surfaces.names)
    for key, named in (("surfaces", cfg.surfaces.values()), ("val_to_train", cfg.val_to_train), ("peer_ne", cfg.peer_ne)):
        if unknown := sorted(set(named) - declared):
            raise ConfigError(f"{where}: `{key}` names {unknown}, not declared in surfaces.yaml "
                              f"(declared: {sorted(declared)})")


def source_dir(cfg: SourceConfig) -> Path:
    """GEM_SOURCE_DIR (a full download) or the config's default (the shared sample)."""
    given = env("GEM_SOURCE_DIR")
    return (Path(given).expanduser() if given else REPO_ROOT / cfg.default_dir).resolve()


def need_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: source file is missing (see docs/real_data.md)")
    return path


def _matches(directory: Path, name: str) -> list[Path]:
    """A plain name must exist; a glob may match nothing (a role's globs together must match a file)."""
    if not any(c in name for c in "*?["):
        return [need_file(directory / name)]
    return sorted(p for p in directory.glob(name) if p.is_file())


def source_files(cfg: SourceConfig, directory: Path) -> list[tuple[str, Path]]:
    """(role, path) of every configured file, in order (the user's download, unchanged)."""
    out = []
    for role, names in cfg.files.items():
        paths = [p for name in names for p in _matches(directory, name)]
        if not paths:
            raise FileNotFoundError(f"{directory}: no file matches {list(names)} (role {role!r}; see docs/real_data.md)")
        out += [(role, p) for p in dict.fromkeys(paths)]  # a file two globs match is read once
    return out


def side_files(cfg: SourceConfig, directory: Path) -> list[Path]:
    """The side tables' files (and MIND's news / Ali-CCP's common features): all must exist."""
    return [p for name in (*(t.file for t in cfg.side_tables), *cfg.news, *cfg.common) for p in _matches(directory, name)]


# ------------------------------------------------------------------------------------------------
# Reading rows


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped by suffix, without a UTF-8 byte-order mark (spreadsheet exports write one: it
    would be part of the first column's name); a file that cannot be read is an error naming it."""
    try:
        data = path.read_bytes()
        data = gzip.decompress(data) if path.suffix == ".gz" else data
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read the file: {e}") from e
    return data.removeprefix(codecs.BOM_UTF8)


def read_rows(path: Path, *, sep: str = ",", header: bool = True, n_fields: int | None = None) -> tuple[pl.DataFrame, list[str]]:
    """Data rows of a delimited text file: (source_file, line_no, raw, fields, ok), and the header.

    line_no is the 1-based line of the file (a header is line 1). ok: the row has as many fields
    as the header (or `n_fields`); rows are split on `sep` only (these datasets use no quoting).
    """
    lines, utf8 = split_lines(read_bytes(path))  # a line that is not UTF-8 is no row (ok false): quarantined
    lines = [ln.removesuffix("\r") for ln in lines]
    if header and not lines:
        raise ValueError(f"{path}: empty file, expected a header line")
    if header and not utf8[0]:
        raise ValueError(f"{path}: line 1 (the header) is not valid UTF-8: {lines[0][:200]!r}")
    head, first = (lines[0].split(sep), 2) if header else ([], 1)
    lines, utf8 = lines[first - 1:], utf8[first - 1:]
    n = n_fields or len(head)
    df = pl.DataFrame(
        {
            "source_file": pl.Series([path.name] * len(lines), dtype=pl.String),
            "line_no": pl.Series(range(first, first + len(lines)), dtype=pl.Int64),
            "raw": pl.Series(lines, dtype=pl.String),
        }
    ).with_columns(fields=pl.col("raw").str.split(sep))
    ok = (pl.col("fields").list.len() == n) & (pl.col("raw").str.strip_chars() != "") & pl.lit(pl.Series(utf8, dtype=pl.Boolean))
    return df.with_columns(ok=ok), head


def field_at(i: int) -> pl.Expr:
    """Field i of an ok row as text (empty -> null, so a missing id is `missing_id`)."""
    v = pl.when(pl.col("ok")).then(pl.col("fields").list.get(i, null_on_oob=True))
    return pl.when(v.str.strip_chars() == "").then(None).otherwise(v)


def strip_prefix(v: pl.Expr, prefix: str) -> pl.Expr:
    """`U123` -> `123`; anything else unchanged (so the row rules see it and say bad_type)."""
    rest = v.str.slice(len(prefix))
    return pl.when(v.str.starts_with(prefix) & rest.str.contains(r"^[0-9]+$")).then(rest).otherwise(v)


def map_surface(rows: pl.DataFrame, raw_value: pl.Expr, cfg: SourceConfig) -> pl.DataFrame:
    """`surface` from the dataset's surface column; a value not declared in source.yaml makes the row
    `unmapped` (landed in the first surface's partition as a record of an unknown kind: unknown_enum)."""
    mapping = pl.DataFrame({"_key": list(cfg.surfaces), "_surface": list(cfg.surfaces.values())})
    rows = rows.with_columns(_key=raw_value).join(mapping, on="_key", how="left", maintain_order="left")
    return rows.with_columns(
        unmapped=pl.col("ok") & pl.col("_surface").is_null(),
        ok=pl.col("ok") & pl.col("_surface").is_not_null(),
        surface=pl.col("_surface").fill_null(next(iter(cfg.surfaces.values()))),
    ).drop("_key", "_surface")


def unit_hash(seed: int, values: Sequence[str | None]) -> list[float]:
    """A deterministic uniform [0, 1) per text value (blake2b: stable everywhere)."""
    digest = {v: hashlib.blake2b(f"{seed}|{'' if v is None else v}".encode(), digest_size=8).digest() for v in set(values)}
    return [int.from_bytes(digest[v], "little") / 2**64 for v in values]


def row_unit(seed: int, source_file: pl.Series, line_no: pl.Series) -> np.ndarray:
    """unit_hash of (file, line) for many rows at once: blake2b of the file name, splitmix64 of the line."""
    files = {f: unit_hash(seed, [f])[0] for f in source_file.unique().to_list()}
    base = (source_file.replace_strict(files, return_dtype=pl.Float64).to_numpy() * 2**53).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = base ^ (line_no.to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / 2.0**53


# ------------------------------------------------------------------------------------------------
# The split: roles -> days of the calendar


def train_day_cuts(cfg: SourceConfig, calendar: CalendarConfig) -> tuple[list[dt.date], list[float]]:
    """The train days (warm-up .. E-2) and the cumulative share cut of each."""
    roles, s = calendar.roles(), cfg.train_days
    n_teacher = (roles.teacher[1] - roles.teacher[0]).days + 1
    n_student_only = (roles.student[1] - roles.teacher[1]).days
    weights = [s.warmup] + [s.teacher / n_teacher] * n_teacher
    weights += [s.student_only / n_student_only] * n_student_only if n_student_only else []
    total = sum(weights)  # renormalise when there are no student-only days
    cuts = list(accumulate(w / total for w in weights))
    cuts[-1] = 1.0
    return [roles.warmup + dt.timedelta(days=i) for i in range(len(weights))], cuts


def assign_days(rows: pl.DataFrame, cfg: SourceConfig, calendar: CalendarConfig) -> pl.DataFrame:
    """`date` from `role`: test -> E, val -> E-1 (but a `val_to_train` share of a surface's val rows
    joins train), train -> warm-up .. E-2 by `train_days`; seeded per-row hashes, never a label."""
    roles = calendar.roles()
    days, cuts = train_day_cuts(cfg, calendar)
    u = row_unit(cfg.seed, rows["source_file"], rows["line_no"])
    train_day = pl.lit(pl.Series(days).gather(np.searchsorted(cuts, u, side="right")))  # the first cut above u
    # a second, independent hash: which val rows move does not depend on which day they get
    u2 = pl.lit(pl.Series(row_unit(cfg.seed + 1, rows["source_file"], rows["line_no"]), dtype=pl.Float64))
    moved = u2 < pl.col("surface").replace_strict(cfg.val_to_train, default=0.0, return_dtype=pl.Float64)
    date = (
        pl.when(pl.col("role") == "test").then(pl.lit(roles.evaluation))
        .when((pl.col("role") == "val") & ~moved).then(pl.lit(roles.validation))
        .otherwise(train_day)
    )  # fmt: skip
    return rows.with_columns(role=pl.when((pl.col("role") == "val") & moved).then(pl.lit("train")).otherwise("role"),
                             date=date.cast(pl.Date))


def split_by_user(rows: pl.DataFrame, cfg: SourceConfig) -> pl.DataFrame:
    """`role` by the seeded per-user rule (datasets without split files): a user always gets one role;
    a row that could not be read is keyed by its text."""
    s = cfg.user_split
    key = rows.select(pl.when(pl.col("ok")).then(pl.col("user_id")).otherwise(pl.col("raw")))["user_id"]
    roles = ["train" if u < s.train else "val" if u < s.train + s.val else "test" for u in unit_hash(cfg.seed + 2, key)]
    return rows.with_columns(role=pl.Series(roles, dtype=pl.String))


# ------------------------------------------------------------------------------------------------
# Writing landing/


def _iso(seconds: pl.Expr) -> pl.Expr:
    """date + seconds -> ISO-8601 text ending in Z (the jsonl_nested timestamp)."""
    ts = pl.col("date").cast(pl.Datetime("us")) + pl.duration(seconds=seconds)
    return ts.dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def impression_lines(rows: pl.DataFrame) -> pl.Series:
    """jsonl_nested `ad` records of mapped rows; a record of kind `unmapped_surface` holding the line for
    a row of an undeclared surface (unknown_enum); the raw line of a row that could not be parsed (after
    UNPARSEABLE where it looks like a JSON record: it must not parse as one).
    Optional columns: unmapped, the spec's fields tenure_days, position, bid (null: the constant), and its
    context columns `context.<name>` (text), written as the record's `context` object."""
    c = pl.col
    context = [k for k in rows.columns if k.startswith("context.")]

    def field(name: str, constant: str) -> pl.Expr:  # a spec's field where it has one, else the constant
        return c(name).fill_null(pl.lit(constant)) if name in rows.columns else pl.lit(constant)

    click_ts = pl.when(c("click") == "1").then(_iso(c("seconds") + CLICK_DELAY_S))
    conv_ts = pl.when(c("conversion") == "1").then(_iso(c("seconds") + CLICK_DELAY_S))
    rec = pl.struct(
        pl.lit("ad").alias("kind"),
        c("request_id"),
        _iso(c("seconds")).alias("ts"),
        pl.struct(c("user_id").alias("id"), pl.lit(DEVICE).alias("device"), field("tenure_days", TENURE).alias("tenure_days")).alias("user"),
        pl.struct(c("ad_id").alias("id"), c("advertiser_id"), pl.lit(OBJECTIVE).alias("objective"),
                  pl.lit(CREATIVE_FORMAT).alias("creative_format"), field("bid", BID).alias("bid")).alias("ad"),
        pl.struct(field("position", POSITION).alias("position")).alias("slot"),
        pl.struct(c("click"), click_ts.alias("click_ts"), c("conversion"), conv_ts.alias("conversion_ts")).alias("engagement"),
        *([pl.struct(c(k).alias(k.removeprefix("context.")) for k in context).alias("context")] if context else []),
    ).struct.json_encode()
    unmapped = pl.struct(pl.lit("unmapped_surface").alias("kind"), c("raw")).struct.json_encode()
    is_unmapped = c("unmapped") if "unmapped" in rows.columns else pl.lit(False)
    raw = pl.when(c("raw").str.strip_chars_start().str.starts_with("{")).then(UNPARSEABLE + c("raw")).otherwise(c("raw"))
    return rows.select(line=pl.when(c("ok")).then(rec).when(is_unmapped).then(unmapped).otherwise(raw))["line"]


def organic_lines(hist: pl.DataFrame) -> pl.Series:
    """jsonl_nested `organic` records: hist has date, seconds, user_id, item_id, action (text)."""
    c = pl.col
    rec = pl.struct(
        pl.lit("organic").alias("kind"),
        _iso(c("seconds")).alias("ts"),
        pl.struct(c("user_id").alias("id")).alias("user"),
        c("item_id"),
        c("action"),
    ).struct.json_encode()
    return hist.select(line=rec)["line"]


@dataclass
class ImportResult:
    dataset: str
    source_dir: Path
    files: dict[str, int]  # source file -> data rows read
    unmapped: dict[str, int]  # source file -> rows not mapped: unparseable, or of an undeclared surface (unknown_enum)
    partitions: dict[str, int]  # "<date>|<surface>" -> landing records
    history_records: int = 0
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. purchase_without_click rows and rule


def write_landing(
    dataset: str,
    src: Path,
    impressions: pl.DataFrame,
    history: pl.DataFrame | None,
    surfaces: SurfacesConfig,
    calendar: CalendarConfig,
    home: Path,
    notes: dict[str, Any] | None = None,
) -> ImportResult:
    """Write every (date, surface) partition of the window (empty ones too), the lineage and the manifest.
    impressions: source_file, line_no, raw, ok, surface, date, seconds, request_id, user_id, ad_id,
    advertiser_id, click, conversion (text). history (de-duplicated): source_file, line_no, surface,
    date, seconds, user_id, item_id, action."""
    validate_name(dataset, "dataset")
    impressions = impressions.with_columns(pl.col("seconds").cast(pl.Int64))
    imp = impressions.with_columns(line=impression_lines(impressions), kind=pl.lit("row"))
    cols = ["surface", "date", "seconds", "source_file", "line_no", "kind", "line", "request_id"]
    parts = [imp.select(cols)]
    if history is not None and history.height:
        history = history.with_columns(pl.col("seconds").cast(pl.Int64))
        hist = history.with_columns(line=organic_lines(history), kind=pl.lit("history"),
                                    request_id=pl.lit(None, pl.String))
        parts.append(hist.select(cols))
    allrec = pl.concat(parts).sort("surface", "date", "seconds", "kind", "source_file", "line_no")
    allrec = allrec.with_columns(feed_line=pl.int_range(1, pl.len() + 1).over("surface", "date").cast(pl.Int64))
    check_partitions(dataset, allrec, surfaces, calendar)  # before any write: a failure leaves landing/ as it was
    landing = home / "landing"
    counts: dict[str, int] = {}
    for day in calendar.dates():
        for s in surfaces.names:
            part = allrec.filter((pl.col("surface") == s) & (pl.col("date") == day))
            write_text(landing / s / day.isoformat() / FEED, "".join(line + "\n" for line in part["line"].to_list()))
            counts[f"{day.isoformat()}|{s}"] = part.height
    lineage = allrec.select(
        "surface", "date", pl.lit(FEED).alias("feed_file"), "feed_line", "kind", "source_file", "line_no",
        "request_id",  # the impression's own id (a source line may hold several impressions: MIND behaviors)
    )
    out = home / "imports" / dataset
    with atomic_path(out / "lineage.parquet") as tmp:
        lineage.write_parquet(tmp)
    result = ImportResult(
        dataset=dataset,
        source_dir=src,
        files={f: int(n) for f, n in impressions.group_by("source_file").len().iter_rows()},
        unmapped={f: int(n) for f, n in impressions.filter(~pl.col("ok")).group_by("source_file").len().iter_rows()},
        partitions=counts,
        history_records=0 if history is None else history.height,
        notes=dict(notes or {}),
    )
    write_json(out / "manifest.json", asdict(result), sort_keys=True)
    return result


def check_partitions(dataset: str, records: pl.DataFrame, surfaces: SurfacesConfig, calendar: CalendarConfig) -> None:
    """Every record falls in a partition landing/ will hold, else an error naming the values and a row."""
    for what, bad, allowed in (
        ("surface", ~pl.col("surface").is_in(surfaces.names), f"not declared in surfaces.yaml {list(surfaces.names)}"),
        ("date", ~pl.col("date").is_in(calendar.dates()), f"outside the window {calendar.start} .. {calendar.end()}"),
    ):
        out = records.filter(bad)
        if out.height:
            values = sorted({str(v) for v in out[what].unique().head(5).to_list()})
            first = out.row(0, named=True)
            raise ValueError(f"{dataset}: {out.height} records of {what} {values} {allowed} "
                             f"(first: {first['source_file']} line {first['line_no']})")


def apply_purchase_rule(rows: pl.DataFrame, cfg: SourceConfig) -> tuple[pl.DataFrame, dict[str, Any]]:
    """source.yaml `purchase_without_click` on purchase = 1 with click = 0: (rows, the import's notes)."""
    rule = cfg.purchase_without_click
    if rule is None:
        return rows, {}
    quirk = (pl.col("conversion") == "1") & (pl.col("click") == "0")
    n = int(rows.select(quirk.fill_null(False).sum()).item())
    if rule == "drop_purchase":
        rows = rows.with_columns(conversion=pl.when(quirk).then(pl.lit("0")).otherwise(pl.col("conversion")))
    return rows, {PURCHASE_WITHOUT_CLICK: n, "purchase_without_click_rule": rule}


def request_ids() -> pl.Expr:
    """`<file name>:<line>`: unique per dataset (the whole name: `log.csv` and `log.txt` differ), and it
    names the source row of every event."""
    return pl.col("source_file") + ":" + pl.col("line_no").cast(pl.String)
