"""Table-level validation of lake partitions with Great Expectations 1.x suites.

Suites live in `assets/expectations/<table>.json` in GX's own ExpectationSuite serialisation (editable by
hand) and check the clean rows of one partition: row-level rules have already quarantined bad records. The
suite parameters `{"$PARAMETER": "surfaces"}` and `{"$PARAMETER": "domains"}` come from `assets/surfaces.yaml`,
so a new surface needs no suite edit. GX has no polars support: a partition (or a seeded sample of `max_rows`
rows, `sampled=True`) is validated as pandas in the BASIC result format (observed values or unexpected counts,
five unexpected values); GX internals are touched only in `gx_memo.py`. Results are kept as JSON in
`<docs_dir>/_stores/validations/` and rendered by `docs_view.py` into a Data Docs site readable offline (GX's
own pages load scripts from CDNs; default `$GEM_HOME/reports/data_docs`): a page per run (`SuiteResult.page`),
per suite, and an index, written once per ingest run (`build_docs`). GX is imported lazily (about 3 s).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import functools
import json
import logging
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gem_model.config import ASSETS_DIR, ConfigError, load_features, load_surfaces, spec_path, validate_name
from gem_model.store.paths import reports_dir

if TYPE_CHECKING:
    import polars as pl

EXPECTATIONS_DIR = ASSETS_DIR / "expectations"
DATASOURCE = "gem_lake"
STORES_SUBDIR = "_stores"
INDEX_RESULTS_LIMIT = 1000  # the index lists at most this many (newest) validation runs
MANIFEST = "index.json"  # in _stores/: one entry per rendered page, what the index lists
KEEP_RUNS_PER_PARTITION = 5  # older runs of the same table partition are deleted from the site
# BASIC: what decides success (an unexpected count, an observed aggregate) plus five unexpected values, for
# every expectation, so the page shows each one's observed value. It costs about 3% more than BOOLEAN_ONLY
# (which reports nothing of a passing expectation); SUMMARY's value counts cost about half a suite's time.
PASS_FORMAT: dict[str, Any] = {"result_format": "BASIC", "partial_unexpected_count": 5}
DETAIL_FORMAT: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 5}  # bench/ingest.py's
_RUN_NAME_RE = re.compile(r"[^A-Za-z0-9_.=-]+")


@dataclass(frozen=True)
class SuiteResult:
    """The outcome of one suite on one partition, small enough for Dagster check metadata."""

    table: str
    success: bool
    evaluated: int
    successful: int
    failed_expectations: list[dict[str, Any]]  # [{"expectation": type, "column": ..., "observed": text}]
    rows_validated: int
    sampled: bool
    docs_index: str | None  # path of the Data Docs index.html
    rows_total: int = 0  # rows of the partition (== rows_validated unless sampled)
    partition_key: str = ""
    page: str | None = None  # path of this run's own Data Docs page (written by build_docs)
    run_time: str = ""
    gx_result: dict[str, Any] | None = field(default=None, repr=False, compare=False)  # GX's result, as JSON

    def to_metadata(self) -> dict[str, Any]:
        """A plain JSON-able summary (Dagster metadata accepts it as is)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gx_result"}
        out["failed"] = self.evaluated - self.successful
        return json.loads(json.dumps(out, default=str))


def suite_path(table: str) -> Path:
    name = validate_name(table, "table")
    own = spec_path(f"expectations/{name}.json")  # a dataset's own suite: assets/sources/<GEM_DATA>/expectations/
    return own if own.parent != ASSETS_DIR / "expectations" else EXPECTATIONS_DIR / f"{name}.json"


def load_suite_spec(table: str) -> dict[str, Any]:
    """Read `assets/expectations/<table>.json`; ConfigError naming the file if missing or malformed."""
    path = suite_path(table)
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: expectation suite for table {table!r} not found") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a JSON object (an ExpectationSuite) at the top level")
    if spec.get("name") != table:
        raise ConfigError(f"{path}: field 'name' is {spec.get('name')!r}, must equal the table name {table!r}")
    exps = spec.get("expectations")
    if not isinstance(exps, list):
        raise ConfigError(f"{path}: field 'expectations' must be a list")
    for i, e in enumerate(exps):
        if not (isinstance(e, dict) and isinstance(e.get("type"), str) and isinstance(e.get("kwargs"), dict)):
            raise ConfigError(f"{path}: field 'expectations[{i}]' needs a string 'type' and an object 'kwargs'")
    return with_context_columns(table, spec)


def with_context_columns(table: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A dataset's own log columns (features.yaml `context: true`) follow the unified schema's in `events` and
    `training_examples`: an ordered column list there names them last, so no suite is edited per dataset."""
    context = list(load_features().context) if table in ("events", "training_examples") else []
    for e in spec["expectations"]:
        columns = e["kwargs"].get("column_list")
        if context and e["type"] == "expect_table_columns_to_match_ordered_list" and isinstance(columns, list):
            e["kwargs"]["column_list"] = [*columns, *(c for c in context if c not in columns)]
    return spec


def suite_parameters() -> dict[str, list[str]]:
    """Values of the `$PARAMETER`s the suites may reference; the surfaces file is parsed again only when it
    changed (reading it costs as much as validating a small table, and every suite run needs it)."""
    path = spec_path("surfaces.yaml")
    try:
        st = path.stat()
        return copy.deepcopy(_parameters(str(path), st.st_mtime_ns, st.st_size))
    except OSError:
        return _parameters.__wrapped__(str(path), 0, 0)


@functools.lru_cache(maxsize=1)
def _parameters(path: str, mtime_ns: int, size: int) -> dict[str, list[str]]:
    surfaces = load_surfaces()
    return {"surfaces": list(surfaces.names), "domains": list(surfaces.domains)}


# --- GX context, one per process -----------------------------------------------------------------


class _Gx:
    """An ephemeral GX context with one pandas data source; suites are built from their spec files."""

    def __init__(self) -> None:
        import great_expectations as gx

        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = {"globally": False, "metric_calculations": False}
        self.datasource = self.context.data_sources.add_pandas(name=DATASOURCE)
        self.lock = threading.Lock()
        self._targets: dict[str, tuple[str, Any, Any]] = {}  # table -> (suite json, suite, batch definition)

    def target(self, table: str, spec: dict[str, Any]) -> tuple[Any, Any]:
        """The suite of `table` and its whole-dataframe batch definition, rebuilt only when the suite file
        changed since the last call (building them costs more than validating a small table)."""
        key = json.dumps(spec, sort_keys=True)
        cached = self._targets.get(table)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]

        import great_expectations as gx

        suite = gx.ExpectationSuite(name=table, expectations=_build_expectations(table, spec),
                                    meta=spec.get("meta"), notes=spec.get("notes"))
        try:
            asset = self.datasource.get_asset(table)
        except LookupError:
            asset = self.datasource.add_dataframe_asset(name=table)
        try:
            batch_definition = asset.get_batch_definition("whole")
        except KeyError:
            batch_definition = asset.add_batch_definition_whole_dataframe("whole")
        self._targets[table] = (key, suite, batch_definition)
        return suite, batch_definition


def _build_expectations(table: str, spec: dict[str, Any]) -> list[Any]:
    """Expectation objects of a suite spec, each built from its public class in `gx.expectations` (the type
    in CamelCase), so that a bad one is a ConfigError naming the file: ExpectationSuite(expectations=[dict])
    silently drops an invalid one (it only logs)."""
    import great_expectations as gx

    path = suite_path(table)
    out = []
    for i, e in enumerate(spec["expectations"]):
        name = "".join(w.capitalize() for w in e["type"].split("_"))
        cls = getattr(gx.expectations, name, None)
        extra = {k: e[k] for k in ("meta", "notes", "description", "severity") if e.get(k) is not None}
        try:
            if not (isinstance(cls, type) and issubclass(cls, gx.expectations.Expectation)):
                raise ValueError(f"no expectation type {e['type']!r} in great_expectations.expectations")
            out.append(cls(**e["kwargs"], **extra))
        except Exception as err:  # GX raises pydantic's and its own errors for a bad configuration
            raise ConfigError(f"{path}: field 'expectations[{i}]' ({e.get('type')}): {err}") from err
    return out


_GX: _Gx | None = None
_GX_LOCK = threading.Lock()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No warnings or GX log lines reach the console while GX runs."""
    gx_logger = logging.getLogger("great_expectations")
    level = gx_logger.level
    gx_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        gx_logger.setLevel(level)


def _gx() -> _Gx:
    """The process's GX context (no gx/ folder, no analytics, no progress bars)."""
    global _GX
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    with _GX_LOCK:
        if _GX is None:
            _GX = _Gx()
        return _GX


def _site_lock(docs_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Serialise writers of one Data Docs site across processes (the index build removes pages whose
    result it has not seen yet, so two concurrent runs could drop each other's page)."""
    from gem_model.store.delta import _flock  # deltalake: imported when a site is written

    (docs_dir / STORES_SUBDIR).mkdir(parents=True, exist_ok=True)
    return _flock(docs_dir / STORES_SUBDIR / ".lock", exclusive=True)


# --- results -------------------------------------------------------------------------------------------


def _to_pandas(df: pl.DataFrame) -> Any:
    """The pandas frame GX validates. Narrow integer columns become Int64 first: GX's pandas
    `column_values_between` is vectorised only for int64/float64 and calls a Python function per row
    for any other dtype; the values are unchanged (a column with nulls becomes float64 either way)."""
    import polars as pl
    import polars.selectors as cs

    narrow = cs.by_dtype(pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16, pl.UInt32)
    return df.with_columns(narrow.cast(pl.Int64)).to_pandas()


def _run_suite(suite: Any, batch_definition: Any, pdf: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Validate every row of `pdf` against `suite` in PASS_FORMAT; the result as JSON (`gx_memo.validate`)."""
    from gem_pipelines.data.gx_memo import validate

    return validate(suite, batch_definition, pdf, params, PASS_FORMAT).to_json_dict()


def _prune_old_runs(docs_dir: Path, table: str, run_name: str, keep: int) -> None:
    """Keep the newest `keep` stored runs (result JSON and page) of one table partition."""
    runs = docs_dir / STORES_SUBDIR / "validations" / table / run_name
    if not runs.is_dir():
        return
    stamps = sorted(p.name for p in runs.iterdir() if p.is_dir())  # run times sort as text
    for name in stamps[: max(0, len(stamps) - keep)]:
        shutil.rmtree(runs / name, ignore_errors=True)
        shutil.rmtree(docs_dir / "validations" / table / run_name / name, ignore_errors=True)


def validate_frame(
    table: str,
    df: pl.DataFrame,
    *,
    partition_key: str,
    max_rows: int = 500_000,
    docs_dir: Path | None = None,
    seed: int = 0,
    build: bool = True,
) -> SuiteResult:
    """Run the suite of `table` on one partition and store its result; with `build`, render its Data Docs page
    and the index now (an ingest run validates several tables and calls `build_docs` once instead)."""
    from gem_model.store.atomic import write_json
    from gem_pipelines.data.docs_view import column_of, observed

    spec = load_suite_spec(table)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    rows_total = df.height
    sampled = rows_total > max_rows
    if sampled:
        df = df.sample(n=max_rows, seed=seed)
    pdf = _to_pandas(df)
    params = suite_parameters()
    docs_dir = Path(docs_dir if docs_dir is not None else reports_dir() / "data_docs").expanduser().resolve()
    run_name = f"{table}__{_RUN_NAME_RE.sub('_', partition_key) or 'unpartitioned'}"
    with _quiet():
        gx_ctx = _gx()
        with gx_ctx.lock:
            suite, batch_definition = gx_ctx.target(table, spec)
            vr = _run_suite(suite, batch_definition, pdf, params)
    now = dt.datetime.now(dt.UTC)
    rel = Path(table, run_name, now.strftime("%Y%m%dT%H%M%S.%fZ"), table)  # newest sorts last, as text
    with _site_lock(docs_dir):
        _prune_old_runs(docs_dir, table, run_name, keep=KEEP_RUNS_PER_PARTITION - 1)
        write_json(docs_dir / STORES_SUBDIR / "validations" / rel.with_suffix(".json"), vr)
    stats = vr["statistics"]
    index = docs_dir / "index.html"
    result = SuiteResult(
        table=table,
        success=bool(vr["success"]),
        evaluated=int(stats["evaluated_expectations"]),
        successful=int(stats["successful_expectations"]),
        failed_expectations=[{"expectation": r["expectation_config"]["type"],
                              "column": column_of(r["expectation_config"]["kwargs"]), "observed": observed(r)}
                             for r in vr["results"] if not r["success"]],
        rows_validated=len(pdf),
        sampled=sampled,
        docs_index=str(index) if index.exists() else None,
        rows_total=rows_total,
        partition_key=partition_key,
        page=str(docs_dir / "validations" / rel.with_suffix(".html")),
        run_time=now.isoformat(sep=" "),
        gx_result=vr,
    )
    if build:
        build_docs([result], docs_dir)
        result = replace(result, docs_index=str(index))
    return result


def build_docs(results: list[SuiteResult], docs_dir: Path | None = None) -> None:
    """Write the pages of `results`, their suites' pages and the index, once for all of them (one ingest run)."""
    from gem_model.store.atomic import write_text
    from gem_pipelines.data.docs_view import suite_page, validation_page

    docs_dir = Path(docs_dir if docs_dir is not None else reports_dir() / "data_docs").expanduser().resolve()
    results = [r for r in results if r.gx_result is not None and r.page]
    if not results:
        return
    with _site_lock(docs_dir):
        for r in results:
            page = Path(r.page)
            up = "../" * (len(page.relative_to(docs_dir).parts) - 1)
            stored = docs_dir / STORES_SUBDIR / page.relative_to(docs_dir).with_suffix(".json")
            links = {"all validation runs": f"{up}index.html", f"suite {r.table}": f"{up}expectations/{r.table}.html",
                     "this result as JSON": Path(os.path.relpath(stored, page.parent)).as_posix()}
            write_text(page, validation_page(r.gx_result, table_name=r.table, partition=r.partition_key,
                                             run_time=r.run_time, rows=r.rows_validated, sampled=r.sampled,
                                             links=links))
        for table in sorted({r.table for r in results}):
            write_text(docs_dir / "expectations" / f"{table}.html", suite_page(load_suite_spec(table)))
        _write_index(docs_dir, results)


def _write_index(docs_dir: Path, new: list[SuiteResult]) -> None:
    """Add `new` to the manifest, drop pruned pages, and render index.html."""
    from gem_model.store.atomic import write_json, write_text
    from gem_pipelines.data.docs_view import index_page

    manifest_path = docs_dir / STORES_SUBDIR / MANIFEST
    entries = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for r in new:
        rel = Path(r.page).relative_to(docs_dir).as_posix()
        entries[rel] = {"table": r.table, "partition": r.partition_key, "run_time": r.run_time, "success": r.success,
                        "evaluated": r.evaluated, "successful": r.successful, "rows": r.rows_validated,
                        "sampled": r.sampled}
    entries = {k: v for k, v in entries.items() if (docs_dir / k).exists()}
    newest = sorted(entries.items(), key=lambda kv: kv[1]["run_time"], reverse=True)[:INDEX_RESULTS_LIMIT]
    write_json(manifest_path, dict(newest))
    suites = sorted(p.stem for p in (docs_dir / "expectations").glob("*.html"))
    write_text(docs_dir / "index.html", index_page(newest, suites))
