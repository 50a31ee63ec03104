"""Table-level validation of lake partitions with Great Expectations 1.x suites.

Suites live in `assets/expectations/<table>.json` in GX's own ExpectationSuite serialisation
(name + expectations of type/kwargs/meta), so they can be edited by hand. Row-level rules have
already quarantined bad records; these suites check properties of the clean rows of one partition.
Two suite parameters are supplied on every run, so that adding a surface to `assets/surfaces.yaml`
needs no suite edit: `{"$PARAMETER": "surfaces"}` (surface names) and `{"$PARAMETER": "domains"}`.

GX has no polars support: a partition is validated as `df.to_pandas()` (`_to_pandas`), or as a seeded
random sample of `max_rows` rows when it is larger (`sampled=True`). Every row is checked in GX's
BOOLEAN_ONLY format; failures are re-run in SUMMARY for their unexpected values (`_run_suite`).
Each run is stored and rendered into a local Data Docs site (default `$GEM_HOME/reports/data_docs`):
one page per validation run (`SuiteResult.page`, the partition's own page), rendered once per ingest run for all its suites
(`build_docs`), not once per suite; the suites and the JSON validation results behind the site are
kept in `<docs_dir>/_stores/`, so the site keeps the history of every process that wrote to it.
The index (`<docs_dir>/index.html`) is rendered here as plain HTML: GX's own index draws its table
with jQuery and bootstrap-table loaded from a CDN, so offline it shows nothing. The GX context itself
is ephemeral: no `gx/` folder, no network, no analytics, no progress bars. GX is imported lazily
(about 3 s).
"""

from __future__ import annotations

import contextlib
import copy
import html
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
from urllib.parse import urlparse
from urllib.request import url2pathname

from gem_model.config import ASSETS_DIR, ConfigError, load_surfaces, spec_path, validate_name
from gem_model.store.paths import reports_dir

if TYPE_CHECKING:
    import polars as pl

EXPECTATIONS_DIR = ASSETS_DIR / "expectations"
DATASOURCE = "gem_lake"
SITE_NAME = "gem_data_docs"
STORES_SUBDIR = "_stores"
INDEX_RESULTS_LIMIT = 1000  # the index lists at most this many (newest) validation runs
MANIFEST = "index.json"  # in _stores/: one entry per rendered page, what the index lists
KEEP_RUNS_PER_PARTITION = 5  # older runs of the same table partition are deleted from the site
_MAX_OBSERVED = 200  # characters of the `observed` text of a failed expectation
# Every row is validated in BOOLEAN_ONLY: GX then computes only what decides success (an unexpected count,
# an observed aggregate) and skips the unexpected-value lists and value counts that SUMMARY builds for every
# expectation, passing or not (about half of a suite's time, `bench/ingest.py`). The expectations that
# failed, and the few whose observed value the Data Docs page shows (GX's page renderer needs the table's
# columns), are then run again on the same rows in DETAIL_FORMAT, so a failure still reports its unexpected
# values, counts and observed value (check metadata and the Data Docs page).
PASS_FORMAT: dict[str, Any] = {"result_format": "BOOLEAN_ONLY"}
DETAIL_TYPES = frozenset({"expect_table_columns_to_match_ordered_list", "expect_table_row_count_to_be_between",
                          "expect_column_mean_to_be_between"})
DETAIL_FORMAT: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 5}
_CACHED_VIEW = {"module_name": "gem_pipelines.data.docs_view", "class_name": "CachedJinjaPageView"}
_SITE_BUILDER = {"module_name": "gem_pipelines.data.docs_view", "class_name": "StaticOnceSiteBuilder"}
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
    identifier: Any = field(default=None, repr=False, compare=False)  # GX's ValidationResultIdentifier

    def to_metadata(self) -> dict[str, Any]:
        """A plain JSON-able summary (Dagster metadata accepts it as is)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "identifier"}
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
        raise ConfigError(
            f"{path}: field 'name' is {spec.get('name')!r}, must equal the table name {table!r}"
        )
    exps = spec.get("expectations")
    if not isinstance(exps, list):
        raise ConfigError(f"{path}: field 'expectations' must be a list")
    for i, e in enumerate(exps):
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("type"), str)
            or not isinstance(e.get("kwargs"), dict)
        ):
            raise ConfigError(
                f"{path}: field 'expectations[{i}]' needs a string 'type' and an object 'kwargs'"
            )
    return spec


_PARAMETERS: dict[tuple[str, int, int], dict[str, list[str]]] = {}


def suite_parameters() -> dict[str, list[str]]:
    """Values of the `$PARAMETER`s the suites may reference; the surfaces file is parsed again only when it
    changed (reading it costs as much as validating a small table, and every suite run needs it)."""
    path = spec_path("surfaces.yaml")
    try:
        st = path.stat()
    except OSError:
        st = None
    key = (str(path), st.st_mtime_ns, st.st_size) if st is not None else None
    cached = _PARAMETERS.get(key) if key is not None else None
    if cached is None:
        surfaces = load_surfaces()
        cached = {"surfaces": list(surfaces.names), "domains": list(surfaces.domains)}
        if key is not None:
            _PARAMETERS.clear()
            _PARAMETERS[key] = cached
    return copy.deepcopy(cached)


# --- GX context, one per docs_dir and process -------------------------------------------------------


class _Gx:
    """An ephemeral GX context whose suite and result stores and Data Docs site live in docs_dir."""

    def __init__(self, docs_dir: Path) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        self.docs_dir = docs_dir
        stores_dir = docs_dir / STORES_SUBDIR
        stores_dir.mkdir(parents=True, exist_ok=True)
        defaults = InMemoryStoreBackendDefaults(init_temp_docs_sites=False)
        stores = copy.deepcopy(defaults.stores)
        for name, sub in (
            (defaults.expectations_store_name, "expectations"),
            (defaults.validation_results_store_name, "validations"),
        ):
            stores[name]["store_backend"] = {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(stores_dir / sub),
            }
        config = DataContextConfig(
            store_backend_defaults=defaults,
            stores=stores,
            data_docs_sites={
                SITE_NAME: {
                    **_SITE_BUILDER,
                    "show_how_to_buttons": False,
                    "store_backend": {
                        "class_name": "TupleFilesystemStoreBackend",
                        "base_directory": str(docs_dir),
                    },
                    "site_section_builders": {
                        "profiling": "None",
                        "validations": {"view": _CACHED_VIEW},
                        "expectations": {"view": _CACHED_VIEW},
                    },
                }
            },
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        self.datasource = self.context.data_sources.add_pandas(name=DATASOURCE)
        self.lock = threading.Lock()
        self._site_builder: Any = None
        self._targets: dict[str, tuple[str, Any, Any]] = {}  # table -> (suite json, suite, batch definition)
        self.rendered_suites: dict[str, str] = {}  # table -> suite json of its page last rendered here

    @property
    def site_builder(self) -> Any:
        """The Data Docs SiteBuilder of SITE_NAME, built once: GX's `build_data_docs` and `get_docs_sites_urls`
        instantiate a new one (its section builders, renderers and views) on every call."""
        if self._site_builder is None:
            self._site_builder = self.context._init_site_builder_for_data_docs_site_creation(
                site_name=SITE_NAME, site_config=self.context.variables.data_docs_sites[SITE_NAME])
        return self._site_builder

    def target(self, table: str, spec: dict[str, Any]) -> tuple[Any, Any]:
        """The stored suite of `table` and its whole-dataframe batch definition, rebuilt only when the
        suite file changed since the last call (building them costs more than validating a small table)."""
        key = json.dumps(spec, sort_keys=True)
        cached = self._targets.get(table)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]

        import great_expectations as gx

        suite = gx.ExpectationSuite(
            name=table,
            expectations=_build_expectations(table, spec),
            meta=spec.get("meta"),
            notes=spec.get("notes"),
        )
        suite = self.context.suites.add_or_update(suite)  # the Data Docs suite page reads the store
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
    """Expectation objects of a suite spec. ExpectationSuite(expectations=[dict]) silently drops an
    invalid one (it only logs), so each is built here and a bad one is a ConfigError naming the file."""
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    path = suite_path(table)
    out = []
    for i, e in enumerate(spec["expectations"]):
        e = {k: v for k, v in e.items() if k not in ("id", "rendered_content")}
        try:
            out.append(ExpectationConfiguration(**e).to_domain_obj())
        except Exception as err:  # GX raises several unrelated types for a bad configuration
            raise ConfigError(f"{path}: field 'expectations[{i}]' ({e.get('type')}): {err}") from err
    return out


_CONTEXTS: dict[Path, _Gx] = {}
_CONTEXTS_LOCK = threading.Lock()


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


def _gx_for(docs_dir: Path) -> _Gx:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    with _CONTEXTS_LOCK:
        gx_ctx = _CONTEXTS.get(docs_dir)
        if gx_ctx is None:
            gx_ctx = _CONTEXTS[docs_dir] = _Gx(docs_dir)
        return gx_ctx


@contextlib.contextmanager
def _site_lock(docs_dir: Path) -> Iterator[None]:
    """Serialise writers of one Data Docs site across processes (the index build removes pages whose
    result it has not seen yet, so two concurrent runs could drop each other's page)."""
    try:
        import fcntl
    except ImportError:  # Windows: no cross-process lock
        yield
        return
    with open(docs_dir / STORES_SUBDIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- results -------------------------------------------------------------------------------------------


def _column_of(kwargs: dict[str, Any]) -> str | None:
    if "column" in kwargs:
        return kwargs["column"]
    if "column_A" in kwargs:
        return f"{kwargs['column_A']},{kwargs['column_B']}"
    return None  # table-level expectation


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MAX_OBSERVED else text[: _MAX_OBSERVED - 3] + "..."


def _observed(r: Any) -> str:
    info = r.exception_info or {}
    if info.get("raised_exception"):
        return _short(f"error: {info.get('exception_message')}")
    res = r.result or {}
    if "unexpected_count" in res and res.get("unexpected_count") is not None:
        text = f"{res['unexpected_count']} unexpected ({res.get('unexpected_percent') or 0:.3g}%)"
        sample = res.get("partial_unexpected_list")
        if sample:
            text += f", e.g. {json.dumps(sample[:5], default=str)}"
        return _short(text)
    if "observed_value" in res:
        details = res.get("details") or {}
        mismatch = details.get("mismatched")
        return _short(
            f"observed {json.dumps(res['observed_value'], default=str)}"
            + (f"; mismatched {json.dumps(mismatch, default=str)}" if mismatch else "")
        )
    return _short(res) if res else "failed"


def _to_pandas(df: pl.DataFrame) -> Any:
    """The pandas frame GX validates. Narrow integer columns become Int64 first: GX's pandas
    `column_values_between` is vectorised only for int64/float64 and calls a Python function per row
    for any other dtype; the values are unchanged (a column with nulls becomes float64 either way)."""
    import polars as pl
    import polars.selectors as cs

    narrow = cs.by_dtype(pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16, pl.UInt32)
    return df.with_columns(narrow.cast(pl.Int64)).to_pandas()


def _run_suite(suite: Any, batch_definition: Any, pdf: Any, params: dict[str, Any], run_id: Any) -> Any:
    """Validate every row of `pdf` against `suite` in PASS_FORMAT, then re-run the failed expectations and
    those of DETAIL_TYPES on the same rows in DETAIL_FORMAT and put their results in place.

    GX's own Validator, without the Checkpoint and ValidationDefinition around it: those re-serialise and
    compare the suite with its stored copy on every run (`is_fresh`, a third of a small partition's
    validation time) and store the result once more. The result carries the same meta as theirs."""
    import great_expectations as gx
    from great_expectations.constants import DATAFRAME_REPLACEMENT_STR
    from great_expectations.validator.v1_validator import Validator

    from gem_pipelines.data.gx_memo import memoised

    validator = Validator(batch_definition, result_format=PASS_FORMAT, batch_parameters={"dataframe": pdf})
    with memoised():
        vr = validator.validate_expectation_suite(suite, params)
    redo = [i for i, r in enumerate(vr.results) if not r.success or r.expectation_config.type in DETAIL_TYPES]
    if redo and PASS_FORMAT != DETAIL_FORMAT:
        again = gx.ExpectationSuite(
            name=suite.name, expectations=[copy.copy(vr.results[i].expectation_config.to_domain_obj()) for i in redo]
        )
        validator.result_format = DETAIL_FORMAT
        with memoised():
            detail = validator.validate_expectation_suite(again, params).results
        for i, r in zip(redo, detail, strict=True):
            if r.success != vr.results[i].success:  # cannot happen on the same rows; never let a failure pass
                raise RuntimeError(f"{suite.name}: {r.expectation_config.type} gave success={vr.results[i].success}, "
                                   f"then {r.success} on the same rows")
            vr.results[i] = r
    vr.meta.update(run_id=run_id, validation_time=run_id.run_time, batch_parameters={"dataframe": DATAFRAME_REPLACEMENT_STR})
    return vr


def _prune_old_runs(docs_dir: Path, table: str, run_name: str, keep: int) -> None:
    """Keep the newest `keep` stored runs (result JSON and page) of one table partition."""
    runs = docs_dir / STORES_SUBDIR / "validations" / table / run_name
    if not runs.is_dir():
        return
    stamps = sorted(p.name for p in runs.iterdir() if p.is_dir())  # run times sort as text
    for name in stamps[: max(0, len(stamps) - keep)]:
        shutil.rmtree(runs / name, ignore_errors=True)
        shutil.rmtree(docs_dir / "validations" / table / run_name / name, ignore_errors=True)


def _run_name(table: str, partition_key: str) -> str:
    return f"{table}__{_RUN_NAME_RE.sub('_', partition_key) or 'unpartitioned'}"


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
    """Run the suite of `table` on one partition; with `build`, render its Data Docs page and the
    index now (an ingest run validates several tables and calls `build_docs` once instead)."""
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

    with _quiet():
        gx_ctx = _gx_for(docs_dir)
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        run_name = _run_name(table, partition_key)
        with gx_ctx.lock, _site_lock(docs_dir):
            _prune_old_runs(docs_dir, table, run_name, keep=KEEP_RUNS_PER_PARTITION - 1)
            suite, batch_definition = gx_ctx.target(table, spec)
            vr = _run_suite(suite, batch_definition, pdf, params, RunIdentifier(run_name=run_name))
            identifier = ValidationResultIdentifier(
                expectation_suite_identifier=ExpectationSuiteIdentifier(name=table),
                run_id=vr.meta["run_id"],
                batch_identifier=vr.batch_id,
            )
            gx_ctx.context.validation_results_store.set(identifier, vr)
    failed = [
        {
            "expectation": r.expectation_config.type,
            "column": _column_of(r.expectation_config.kwargs),
            "observed": _observed(r),
        }
        for r in vr.results
        if not r.success
    ]
    index = docs_dir / "index.html"
    stats = vr.statistics
    with gx_ctx.lock:
        site_url = gx_ctx.site_builder.get_resource_url(resource_identifier=identifier, only_if_exists=False)
    result = SuiteResult(
        table=table,
        success=bool(vr.success),
        evaluated=int(stats["evaluated_expectations"]),
        successful=int(stats["successful_expectations"]),
        failed_expectations=failed,
        rows_validated=len(pdf),
        sampled=sampled,
        docs_index=str(index) if index.exists() else None,
        rows_total=rows_total,
        partition_key=partition_key,
        page=str(Path(url2pathname(urlparse(site_url).path))),
        run_time=str(identifier.run_id.run_time),
        identifier=identifier,
    )
    if build:
        build_docs([result], docs_dir)
        result = replace(result, docs_index=str(index))
    return result


def build_docs(results: list[SuiteResult], docs_dir: Path | None = None) -> None:
    """Render the pages of `results` and the index, once for all of them (one ingest run)."""
    docs_dir = Path(docs_dir if docs_dir is not None else reports_dir() / "data_docs").expanduser().resolve()
    results = [r for r in results if r.identifier is not None]
    if not results:
        return
    with _quiet():
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        gx_ctx = _gx_for(docs_dir)
        with gx_ctx.lock, _site_lock(docs_dir):
            # a suite's page is rendered again only when its suite changed since this process last rendered it
            # (or the page is gone): rendering it costs as much as a validation page, and it is the same page
            stale = {t: gx_ctx._targets[t][0] for t in sorted({r.table for r in results})
                     if t in gx_ctx._targets and (gx_ctx.rendered_suites.get(t) != gx_ctx._targets[t][0]
                                                  or not (docs_dir / "expectations" / f"{t}.html").exists())}
            gx_ctx.site_builder.build(resource_identifiers=[r.identifier for r in results]
                                      + [ExpectationSuiteIdentifier(name=t) for t in stale], build_index=False)
            gx_ctx.rendered_suites.update(stale)
            _write_index(docs_dir, results)


def _write_index(docs_dir: Path, new: list[SuiteResult]) -> None:
    """Add `new` to the manifest, drop pruned pages, and render index.html as plain HTML (no scripts)."""
    from gem_model.store.atomic import write_json, write_text

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
    rows = "\n".join(
        f'<tr class="{"ok" if e["success"] else "failed"}"><td>{html.escape(e["table"])}</td>'
        f'<td><a href="{html.escape(k)}">{html.escape(e["partition"])}</a></td><td>{html.escape(e["run_time"])}</td>'
        f'<td>{"passed" if e["success"] else "FAILED"}</td><td>{e["successful"]}/{e["evaluated"]}</td>'
        f'<td>{e["rows"]}{" (sample)" if e["sampled"] else ""}</td></tr>'
        for k, e in newest
    )
    suites = "".join(f'<li><a href="expectations/{html.escape(p.name)}">{html.escape(p.stem)}</a></li>'
                     for p in sorted((docs_dir / "expectations").glob("*.html")))
    write_text(docs_dir / "index.html", _INDEX_HTML.format(rows=rows, suites=suites, n=len(newest)))


_INDEX_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GEM Data Docs</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; }}
tr.failed td {{ background: #fde2e2; }} tr.ok td:nth-child(4) {{ color: #176b2c; }}
</style></head>
<body>
<h1>GEM Data Docs</h1>
<p>Great Expectations validation runs of the lake partitions, newest first ({n} runs). Each partition's page
shows every expectation with its observed value. Rendered without scripts, so it reads offline.</p>
<h2>Validation runs</h2>
<table id="validations"><thead><tr><th>table</th><th>partition</th><th>run time (UTC)</th><th>status</th>
<th>expectations met</th><th>rows validated</th></tr></thead>
<tbody>
{rows}
</tbody></table>
<h2>Expectation suites</h2>
<ul>{suites}</ul>
</body></html>
"""
