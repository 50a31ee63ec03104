"""What every importer shares: its config (assets/sources/<name>/source.yaml), reading the source
rows, the split of rows onto the calendar's days, and writing `landing/` in the jsonl_nested format.

An importer turns each data row of a public file into exactly one impression record (plus, where
the data has behaviour sequences, organic activity records for the user's history). A row it can
map (right number of fields) becomes a JSON record whose fields are the source text as JSON
strings, so a bad value (user id "abc", label "2", an empty id) reaches the unchanged row rules in
gem_pipelines/data/normalize.py and is quarantined there with its code (bad_type, missing_id ...).
A row it cannot map (wrong number of fields, a surface value the dataset does not declare) is
written verbatim and quarantined as `unparseable` with the original line as `raw`. Nothing is
dropped: `imports/<dataset>/lineage.parquet` maps every landing line back to (source file, line).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
from pydantic import Field, field_validator, model_validator

from gem_model.config import (
    REPO_ROOT,
    SOURCES_DIR,
    CalendarConfig,
    SurfacesConfig,
    _load,
    _Strict,
    validate_name,
)
from gem_pipelines.sources.layout import Columns, Fields, Read, SideTable, Time

FEED = "feed.jsonl"  # every imported surface uses the jsonl_nested format
ROLES = ("train", "val", "test", "all")
_FILE_RE = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]-]*$")
# Ads fields the public datasets do not have: constants from the closed vocabularies, documented in
# docs/real_data.md. They carry no signal, so the model learns nothing from them.
DEVICE, OBJECTIVE, CREATIVE_FORMAT, POSITION, BID, TENURE = "web", "traffic", "image", "1", "0.0", "0.0"
NOON = 12 * 3600  # datasets without time: every impression of day D at D 12:00:00Z (see split rules)
CLICK_DELAY_S = 1  # a click (and a conversion) is stamped 1 s after its impression


class TrainDays(_Strict):
    """How the train role is spread over the days before validation (shares, must sum to 1)."""

    warmup: float = Field(default=0.1, ge=0, le=1)  # histories only: no model trains on the first day
    teacher: float = Field(default=0.75, ge=0, le=1)  # spread evenly over the teacher's days
    student_only: float = Field(default=0.15, ge=0, le=1)  # days only the students see (teacher lag)

    @model_validator(mode="after")
    def _sum(self) -> TrainDays:
        if abs(self.warmup + self.teacher + self.student_only - 1.0) > 1e-6:
            raise ValueError("train_days: warmup + teacher + student_only must sum to 1")
        return self


class UserSplit(_Strict):
    """Datasets without their own split files: users are assigned to a role by a seeded hash."""

    train: float = Field(default=0.8, ge=0, le=1)
    val: float = Field(default=0.1, ge=0, le=1)
    test: float = Field(default=0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _sum(self) -> UserSplit:
        if abs(self.train + self.val + self.test - 1.0) > 1e-6:
            raise ValueError("user_split: train + val + test must sum to 1")
        return self


def _plain_names(names: Sequence[str]) -> tuple[str, ...]:
    """File names or globs (`*`, `?`, `[...]`) of the source dir itself: no path, no '..'."""
    for name in names:
        if not _FILE_RE.match(name) or ".." in name:
            raise ValueError(f"files: {name!r} must be a plain file name or glob (no path, no '..')")
    return tuple(names)


class SourceConfig(_Strict):
    # spec: the generic importer reads the layout below (gem_pipelines/sources/spec.py); the others
    # are modules for layouts a spec cannot express (docs/real_data.md says why)
    importer: Literal["spec", "taobao", "aliccp", "mind_tsv"] = "spec"
    default_dir: str  # relative to the repo root (the shared samples); GEM_SOURCE_DIR overrides it
    # role (train | val | test | all) -> file names or globs in the source dir. Timed data: `all`
    # (the time decides the day); untimed: split files by role, or `all` with the per-user split
    files: dict[str, tuple[str, ...]]
    read: Read = Read()
    columns: Columns | None = None  # required by importer: spec
    time: Time | None = None  # None: no time in the data (the seeded day rule of docs/real_data.md)
    side_tables: tuple[SideTable, ...] = ()
    fields: Fields = Fields()
    # quarantine: a later exact copy of a line (same text) is the same impression logged twice, filed
    # as duplicate_record; keep: every line is its own impression
    duplicates: Literal["keep", "quarantine"] = "keep"
    seed: int = 0
    surfaces: dict[str, str]  # raw value of the dataset's surface column (or file key) -> surface name
    train_days: TrainDays = TrainDays()
    user_split: UserSplit = UserSplit()
    val_to_train: dict[str, float] = {}  # surface -> share of its val rows moved to the train days
    purchase_without_click: Literal["drop_purchase", "keep"] = "drop_purchase"
    peer_ne: dict[str, float] = {}  # surface -> test click NE of public peer models (targets, not ours)
    news: tuple[str, ...] = ()  # MIND original layout: the news.tsv files (news id -> category, subcategory)
    common: tuple[str, ...] = ()  # Ali-CCP Tianchi layout: the common_features files (md5 -> user features)
    # Douban: a rated item the label calls negative was still consumed; `view` also writes it as the
    # user's organic `view` activity at the impression's time (later days' histories then hold what the
    # user rated low, not only the clicks). None: histories hold clicks only.
    unclicked_as: Literal["view"] | None = None

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for role, names in v.items():
            if role not in ROLES:
                raise ValueError(f"files: unknown role {role!r}; roles: {ROLES}")
            _plain_names(names)
        return v

    @field_validator("news", "common")
    @classmethod
    def _lookup_files(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _plain_names(v)

    @field_validator("side_tables")
    @classmethod
    def _side_files(cls, v: tuple[SideTable, ...]) -> tuple[SideTable, ...]:
        _plain_names([t.file for t in v])
        return v

    @model_validator(mode="after")
    def _spec(self) -> SourceConfig:
        if self.importer == "spec" and self.columns is None:
            raise ValueError("columns: the generic importer (importer: spec) needs the log's columns")
        if self.time is not None and set(self.files) != {"all"}:
            raise ValueError("files: timed data lists its files under `all` (the time decides each row's day)")
        return self

    @field_validator("surfaces")
    @classmethod
    def _surfaces(cls, v: dict[str, str]) -> dict[str, str]:
        return {k: validate_name(s, "surface") for k, s in v.items()}

    @field_validator("val_to_train")
    @classmethod
    def _shares(cls, v: dict[str, float]) -> dict[str, float]:
        for s, share in v.items():
            validate_name(s, "surface")
            if not 0 <= share < 1:
                raise ValueError(f"val_to_train: share of {s!r} must be in [0, 1)")
        return v


def load_source(name: str) -> SourceConfig:
    validate_name(name, "dataset")
    return _load(SourceConfig, SOURCES_DIR / name / "source.yaml")


def source_dir(cfg: SourceConfig) -> Path:
    """GEM_SOURCE_DIR (a full download) or the config's default (the shared sample)."""
    env = os.environ.get("GEM_SOURCE_DIR")
    d = Path(env).expanduser() if env else REPO_ROOT / cfg.default_dir
    return d.resolve()


def _matches(directory: Path, name: str) -> list[Path]:
    """A plain name must exist; a glob may match nothing (a role's globs together must match a file)."""
    if not any(c in name for c in "*?["):
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: source file is missing (see docs/real_data.md)")
        return [path]
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


def read_rows(path: Path, *, sep: str = ",", header: bool = True, n_fields: int | None = None) -> tuple[pl.DataFrame, list[str]]:
    """Data rows of a delimited text file: (source_file, line_no, raw, fields, ok), and the header.

    line_no is the 1-based line of the file (a header is line 1). ok: the row has as many fields
    as the header (or `n_fields`); rows are split on `sep` only (these datasets use no quoting).
    """
    data = path.read_bytes()
    text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln.removesuffix("\r") for ln in lines]
    head: list[str] = []
    first = 1
    if header:
        if not lines:
            raise ValueError(f"{path}: empty file, expected a header line")
        head = lines[0].split(sep)
        lines, first = lines[1:], 2
    n = n_fields or len(head)
    df = pl.DataFrame(
        {
            "source_file": pl.Series([path.name] * len(lines), dtype=pl.String),
            "line_no": pl.Series(range(first, first + len(lines)), dtype=pl.Int64),
            "raw": pl.Series(lines, dtype=pl.String),
        }
    ).with_columns(fields=pl.col("raw").str.split(sep))
    return df.with_columns(ok=(pl.col("fields").list.len() == n) & (pl.col("raw").str.strip_chars() != "")), head


def field_at(i: int) -> pl.Expr:
    """Field i of an ok row as text (empty -> null, so a missing id is `missing_id`)."""
    v = pl.when(pl.col("ok")).then(pl.col("fields").list.get(i, null_on_oob=True))
    return pl.when(v.str.strip_chars() == "").then(None).otherwise(v)


def map_surface(rows: pl.DataFrame, raw_value: pl.Expr, cfg: SourceConfig, fallback: str) -> pl.DataFrame:
    """`surface` from the dataset's surface column; a value not declared in source.yaml makes the
    row `unmapped` (landed in `fallback`'s partition as a record of an unknown kind: unknown_enum)."""
    mapping = pl.DataFrame({"_key": list(cfg.surfaces), "_surface": list(cfg.surfaces.values())})
    rows = rows.with_columns(_key=raw_value).join(mapping, on="_key", how="left", maintain_order="left")
    return rows.with_columns(
        unmapped=pl.col("ok") & pl.col("_surface").is_null(),
        ok=pl.col("ok") & pl.col("_surface").is_not_null(),
        surface=pl.col("_surface").fill_null(fallback),
    ).drop("_key", "_surface")


def unit_hash(seed: int, *parts: Sequence[str | None]) -> list[float]:
    """A deterministic uniform [0, 1) per key from its text parts (blake2b: stable everywhere)."""
    cache: dict[tuple, float] = {}
    out = []
    for values in zip(*parts, strict=True):
        if values not in cache:
            key = f"{seed}|" + "|".join("" if v is None else str(v) for v in values)
            h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
            cache[values] = h / 2**64
        out.append(cache[values])
    return out


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
    roles = calendar.roles()
    teacher = [roles.teacher[0] + dt.timedelta(days=i) for i in range((roles.teacher[1] - roles.teacher[0]).days + 1)]
    student_only = [roles.teacher[1] + dt.timedelta(days=i) for i in range(1, (roles.student[1] - roles.teacher[1]).days + 1)]
    weights = [(roles.warmup, cfg.train_days.warmup)]
    weights += [(d, cfg.train_days.teacher / len(teacher)) for d in teacher]
    so = cfg.train_days.student_only if student_only else 0.0
    weights += [(d, so / len(student_only)) for d in student_only]
    total = sum(w for _, w in weights)  # renormalise when there are no student-only days
    days, cuts, acc = [], [], 0.0
    for d, w in weights:
        acc += w / total
        days.append(d)
        cuts.append(acc)
    cuts[-1] = 1.0
    return days, cuts


def assign_days(rows: pl.DataFrame, cfg: SourceConfig, calendar: CalendarConfig) -> pl.DataFrame:
    """Add `date` from `role` (train | val | test) and the seeded rule of the README.

    test -> E, val -> E-1 (except a `val_to_train` share of a surface's val rows, chosen by a
    seeded per-row hash, which joins train), train -> one of warm-up .. E-2 by a seeded per-row
    hash and the `train_days` shares. Nothing here ever looks at a label.
    """
    roles = calendar.roles()
    u = row_unit(cfg.seed, rows["source_file"], rows["line_no"])
    rows = rows.with_columns(u=pl.Series(u, dtype=pl.Float64))
    moved = pl.lit(False)
    for surface, share in cfg.val_to_train.items():
        # a second, independent hash: which val rows move does not depend on which day they get
        moved = moved | ((pl.col("surface") == surface) & (pl.col("u2") < share))
    u2 = row_unit(cfg.seed + 1, rows["source_file"], rows["line_no"])
    rows = rows.with_columns(u2=pl.Series(u2, dtype=pl.Float64))
    rows = rows.with_columns(role=pl.when((pl.col("role") == "val") & moved).then(pl.lit("train")).otherwise("role"))
    days, cuts = train_day_cuts(cfg, calendar)
    train_day = pl.lit(days[-1])
    for d, c in reversed(list(zip(days, cuts, strict=True))):
        train_day = pl.when(pl.col("u") < c).then(pl.lit(d)).otherwise(train_day)
    date = (
        pl.when(pl.col("role") == "test").then(pl.lit(roles.evaluation))
        .when(pl.col("role") == "val").then(pl.lit(roles.validation))
        .otherwise(train_day)
    )  # fmt: skip
    return rows.with_columns(date=date.cast(pl.Date)).drop("u", "u2")


def user_roles(users: Sequence[str | None], cfg: SourceConfig) -> list[str]:
    """Seeded per-user rule for datasets without split files: the same user always gets one role."""
    s = cfg.user_split
    out = []
    for u in unit_hash(cfg.seed + 2, users):
        out.append("train" if u < s.train else "val" if u < s.train + s.val else "test")
    return out


# ------------------------------------------------------------------------------------------------
# Writing landing/


def _iso(seconds: pl.Expr) -> pl.Expr:
    """date + seconds -> ISO-8601 text ending in Z (the jsonl_nested timestamp)."""
    ts = pl.col("date").cast(pl.Datetime("us")) + pl.duration(seconds=seconds)
    return ts.dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def impression_lines(rows: pl.DataFrame) -> pl.Series:
    """jsonl_nested `ad` records for mapped rows; for a row of an undeclared surface a record of kind
    `unmapped_surface` holding the line (quarantined unknown_enum); the raw line itself for a row
    that could not be parsed (quarantined unparseable).

    rows: ok, raw, request_id, date, seconds, user_id, ad_id, advertiser_id, click, conversion
    (text; conversion null where the surface logs none); optionally unmapped, and the spec's fields
    tenure_days, position, bid (null: the constant).
    """
    c = pl.col

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
    ).struct.json_encode()
    unmapped = pl.struct(pl.lit("unmapped_surface").alias("kind"), c("raw")).struct.json_encode()
    is_unmapped = c("unmapped") if "unmapped" in rows.columns else pl.lit(False)
    return rows.select(line=pl.when(c("ok")).then(rec).when(is_unmapped).then(unmapped).otherwise(c("raw")))["line"]


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
    unmapped: dict[str, int]  # source file -> rows written verbatim (quarantined as unparseable)
    partitions: dict[str, int]  # "<date>|<surface>" -> landing records
    history_records: int = 0
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. purchase_without_click rows and rule


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    """Write every (date, surface) partition of the window (empty ones too) and the lineage.

    impressions: source_file, line_no, raw, ok, surface, date, seconds, request_id, user_id, ad_id,
    advertiser_id, click, conversion. history: source_file, line_no, surface, date, seconds,
    user_id, item_id, action (already de-duplicated).
    """
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
    landing = home / "landing"
    counts: dict[str, int] = {}
    for day in calendar.dates():
        for s in surfaces.names:
            validate_name(s, "surface")
            part = allrec.filter((pl.col("surface") == s) & (pl.col("date") == day))
            text = "".join(line + "\n" for line in part["line"].to_list())
            _atomic_write(landing / s / day.isoformat() / FEED, text)
            counts[f"{day.isoformat()}|{s}"] = part.height
    outside = allrec.filter(~pl.col("surface").is_in(surfaces.names) | ~pl.col("date").is_in(calendar.dates()))
    if outside.height:
        raise ValueError(f"{dataset}: {outside.height} records fall outside the window or the declared surfaces")
    lineage = allrec.select(
        "surface", "date", pl.lit(FEED).alias("feed_file"), "feed_line", "kind", "source_file", "line_no",
        "request_id",  # the impression's own id (a source line may hold several impressions: MIND behaviors)
    )
    out = home / "imports" / dataset
    out.mkdir(parents=True, exist_ok=True)
    lineage.write_parquet(out / ".lineage.parquet.tmp")
    os.replace(out / ".lineage.parquet.tmp", out / "lineage.parquet")
    result = ImportResult(
        dataset=dataset,
        source_dir=src,
        files={f: int(n) for f, n in impressions.group_by("source_file").len().iter_rows()},
        unmapped={f: int(n) for f, n in impressions.filter(~pl.col("ok")).group_by("source_file").len().iter_rows()},
        partitions=counts,
        history_records=0 if history is None else history.height,
        notes=dict(notes or {}),
    )
    manifest = {"dataset": dataset, "source_dir": str(src), "files": result.files, "unmapped": result.unmapped,
                "history_records": result.history_records, "notes": result.notes, "partitions": counts}
    _atomic_write(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
    return result


def request_ids(rows: pl.DataFrame) -> pl.Expr:
    """`<file stem>:<line>`: unique per dataset, and it names the source row of every event."""
    return pl.col("source_file").str.replace(r"\.[^.]*$", "") + ":" + pl.col("line_no").cast(pl.String)
