"""GX suites in assets/expectations/ against the lake schemas, and validate_frame end to end."""

from __future__ import annotations

import datetime as dt
import json
import re

import numpy as np
import polars as pl
import pytest

from gem_model.config import ConfigError, load_surfaces
from gem_pipelines.data import formats as F
from gem_pipelines.data import validation as V
from gem_pipelines.data.counters import attach_counters

SCHEMAS = {
    "events": F.EVENTS_SCHEMA,
    "user_activity": F.USER_ACTIVITY_SCHEMA,
    "events_quarantine": F.QUARANTINE_SCHEMA,
    "oracle": F.ORACLE_SCHEMA,
    "training_examples": F.TRAINING_EXAMPLES_SCHEMA,
}
DAY = dt.date(2026, 1, 5)
T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)


def _columns_named(spec: dict) -> set[str]:
    names: set[str] = set()
    for e in spec["expectations"]:
        kw = e["kwargs"]
        names.update(kw[k] for k in ("column", "column_A", "column_B") if k in kw)
        names.update(kw.get("column_list", []))
        cond = kw.get("row_condition")
        if isinstance(cond, dict) and "column" in cond:
            names.add(cond["column"]["name"])
    return names


# --- synthetic clean partitions ------------------------------------------------------------------


def events_frame(n: int = 2000, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    secs = rng.integers(0, 86_399, n)
    ts = [T0 + dt.timedelta(seconds=int(s)) for s in secs]
    click = (rng.random(n) < 0.03).astype(np.int8)
    conv = np.where(click == 1, rng.random(n) < 0.2, 0).astype(np.int8)
    return pl.DataFrame(
        {
            "request_id": [f"r{seed}-{i}" for i in range(n)],
            "ts": ts,
            "date": [DAY] * n,
            "surface": ["feed"] * n,
            "domain": ["social"] * n,
            "user_id": rng.integers(1, 1000, n),
            "ad_id": rng.integers(1, 100, n),
            "advertiser_id": rng.integers(1, 10, n),
            "objective": rng.choice(F.OBJECTIVES, n),
            "creative_format": rng.choice(F.CREATIVE_FORMATS, n),
            "device": rng.choice(F.DEVICES, n),
            "position": rng.integers(1, 20, n),
            "bid": rng.random(n) * 3,
            "user_tenure_days": rng.random(n) * 400,
            "hour_of_day": [t.hour for t in ts],
            "click": click,
            "click_ts": [t + dt.timedelta(seconds=30) if c else None for t, c in zip(ts, click, strict=True)],
            "conversion": conv,
            "conversion_ts": [
                t + dt.timedelta(hours=2) if c else None for t, c in zip(ts, conv, strict=True)
            ],
        }
    ).cast(F.EVENTS_SCHEMA)


def activity_frame(n: int = 500) -> pl.DataFrame:
    rng = np.random.default_rng(1)
    source = rng.choice(F.SOURCES, n)
    action = [rng.choice(F.PAID_ACTIONS if s == "paid" else F.ORGANIC_ACTIONS) for s in source]
    return pl.DataFrame(
        {
            "user_id": rng.integers(1, 1000, n),
            "ts": [T0 + dt.timedelta(seconds=int(s)) for s in rng.integers(0, 86_399, n)],
            "date": [DAY] * n,
            "surface": ["reels"] * n,
            "item_id": rng.integers(1, 7000, n),
            "action": action,
            "source": source,
        }
    ).cast(F.USER_ACTIVITY_SCHEMA)


def quarantine_frame(n: int = 5) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "surface": ["marketplace"] * n,
            "date": [DAY] * n,
            "source_file": ["impressions.csv"] * n,
            "line_no": list(range(2, n + 2)),
            "raw": ["x,y"] * n,
            "reason": [F.REASON_CODES[i % len(F.REASON_CODES)] for i in range(n)],
            "detail": [None] * n,
        },
        schema=F.QUARANTINE_SCHEMA,
    )


def oracle_frame(events: pl.DataFrame) -> pl.DataFrame:
    n = events.height
    rng = np.random.default_rng(2)
    return pl.DataFrame(
        {
            "request_id": events["request_id"],
            "date": events["date"],
            "surface": events["surface"],
            "p_click": rng.random(n) * 0.1,
            "p_conversion": [None] * n,
        },
        schema=F.ORACLE_SCHEMA,
    )


def training_frame(events: pl.DataFrame) -> pl.DataFrame:
    n = events.height
    hist = {
        "hist_item_id": [[1, 2, 3]] * (n - 1) + [[]],
        "hist_action": [["view", "like", "click"]] * (n - 1) + [[]],
        "hist_surface": [["feed", "reels", "shops"]] * (n - 1) + [[]],
        "hist_seconds_before": [[30.0, 20.0, 1.5]] * (n - 1) + [[]],
    }
    joined = events.with_columns(**{k: pl.Series(k, v, dtype=F.HISTORY_COLUMNS[k]) for k, v in hist.items()})
    day = dt.timedelta(days=1)
    past = events_frame(seed=1).with_columns(  # the day before: the counters' evidence
        date=pl.col("date") - day, ts=pl.col("ts") - day, click_ts=pl.col("click_ts") - day
    )
    return attach_counters(joined, past, DAY, prior_strength=5.0, joint_passes=3)


@pytest.fixture(scope="module")
def clean_frames() -> dict[str, pl.DataFrame]:
    ev = events_frame()
    return {
        "events": ev,
        "user_activity": activity_frame(),
        "events_quarantine": quarantine_frame(),
        "oracle": oracle_frame(ev),
        "training_examples": training_frame(ev),
    }


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data_docs")


def _failed(result: V.SuiteResult) -> set[tuple[str, str | None]]:
    return {(f["expectation"], f["column"]) for f in result.failed_expectations}


# --- suites ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("table", list(SCHEMAS))
def test_suite_matches_schema(table):
    spec = V.load_suite_spec(table)
    assert spec["name"] == table
    schema = SCHEMAS[table]
    missing = _columns_named(spec) - set(schema)
    assert not missing, f"{table}.json names columns not in the schema: {missing}"
    types = [e["type"] for e in spec["expectations"]]
    ordered = [e for e in spec["expectations"] if e["type"] == "expect_table_columns_to_match_ordered_list"]
    assert ordered and ordered[0]["kwargs"]["column_list"] == list(schema)
    assert all(
        set(e) <= {"type", "kwargs", "meta", "notes", "description", "severity", "id"}
        for e in spec["expectations"]
    )
    assert len(types) >= 5


def test_suites_use_the_contract_enums():
    def value_sets(table):
        return {
            e["kwargs"]["column"]: e["kwargs"]["value_set"]
            for e in V.load_suite_spec(table)["expectations"]
            if e["type"] == "expect_column_values_to_be_in_set" and "row_condition" not in e["kwargs"]
        }

    ev = value_sets("events")
    assert set(ev["objective"]) == set(F.OBJECTIVES)
    assert set(ev["creative_format"]) == set(F.CREATIVE_FORMATS)
    assert set(ev["device"]) == set(F.DEVICES)
    assert ev["surface"] == {"$PARAMETER": "surfaces"}
    ua = value_sets("user_activity")
    assert set(ua["action"]) == set(F.ACTIONS) and set(ua["source"]) == set(F.SOURCES)
    assert set(value_sets("events_quarantine")["reason"]) == set(F.REASON_CODES)
    params = V.suite_parameters()
    assert params["surfaces"] == load_surfaces().names


def test_missing_suite_names_the_path():
    with pytest.raises(ConfigError, match=r"expectations/no_such_table\.json"):
        V.load_suite_spec("no_such_table")
    with pytest.raises(ValueError, match="must match"):
        V.load_suite_spec("../events")


def test_invalid_suite_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(V, "EXPECTATIONS_DIR", tmp_path)
    (tmp_path / "events.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"events\.json: not valid JSON"):
        V.load_suite_spec("events")
    (tmp_path / "events.json").write_text(json.dumps({"name": "oracle", "expectations": []}))
    with pytest.raises(ConfigError, match="must equal the table name"):
        V.load_suite_spec("events")
    bad = {"name": "events", "expectations": [{"type": "expect_column_values_to_be_sparkly", "kwargs": {}}]}
    (tmp_path / "events.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"events\.json: field 'expectations\[0\]'"):
        V.validate_frame("events", events_frame(10), partition_key="p", docs_dir=tmp_path / "docs")


# --- validate_frame ----------------------------------------------------------------------------------


@pytest.mark.parametrize("table", list(SCHEMAS))
def test_clean_frame_passes(table, clean_frames, docs_dir):
    result = V.validate_frame(table, clean_frames[table], partition_key="2026-01-05|feed", docs_dir=docs_dir)
    assert result.success, result.failed_expectations
    assert result.evaluated == result.successful == len(V.load_suite_spec(table)["expectations"])
    assert result.rows_validated == clean_frames[table].height and not result.sampled
    meta = result.to_metadata()
    assert json.loads(json.dumps(meta)) == meta and meta["failed"] == 0


def test_empty_quarantine_partition_passes(docs_dir):
    empty = pl.DataFrame(schema=F.QUARANTINE_SCHEMA)
    assert V.validate_frame("events_quarantine", empty, partition_key="empty", docs_dir=docs_dir).success


@pytest.mark.parametrize(
    ("table", "mutate", "expected"),
    [
        (
            "events",
            lambda df: df.with_columns(request_id=pl.lit("dup")),
            ("expect_column_values_to_be_unique", "request_id"),
        ),
        (
            "events",
            lambda df: df.with_columns(click=pl.lit(7, pl.Int8)),
            ("expect_column_values_to_be_in_set", "click"),
        ),
        (
            "events",
            lambda df: df.with_columns(objective=pl.lit("brand_lift")),
            ("expect_column_values_to_be_in_set", "objective"),
        ),
        (
            "events",
            lambda df: df.with_columns(surface=pl.lit("nowhere")),
            ("expect_column_values_to_be_in_set", "surface"),
        ),
        ("events", lambda df: df.drop("bid"), ("expect_table_columns_to_match_ordered_list", None)),
        ("events", lambda df: df.head(0), ("expect_table_row_count_to_be_between", None)),
        (
            "oracle",
            lambda df: df.with_columns(p_click=pl.lit(1.5)),
            ("expect_column_values_to_be_between", "p_click"),
        ),
        (
            "events_quarantine",
            lambda df: df.with_columns(reason=pl.lit("gremlins")),
            ("expect_column_values_to_be_in_set", "reason"),
        ),
        (
            "user_activity",
            lambda df: df.with_columns(source=pl.lit("paid"), action=pl.lit("like")),
            ("expect_column_values_to_be_in_set", "action"),
        ),
        (
            "training_examples",
            lambda df: df.with_columns(request_id=pl.lit("dup")),
            ("expect_column_values_to_be_unique", "request_id"),
        ),
    ],
    ids=[
        "dup_request_id",
        "click_7",
        "unknown_objective",
        "unknown_surface",
        "missing_column",
        "no_rows",
        "p_click_1.5",
        "unknown_reason",
        "paid_organic_action",
        "training_dup",
    ],
)
def test_violation_is_named(table, mutate, expected, clean_frames, docs_dir):
    result = V.validate_frame(table, mutate(clean_frames[table]), partition_key="bad", docs_dir=docs_dir)
    assert not result.success
    assert expected in _failed(result), result.failed_expectations
    assert result.successful < result.evaluated
    assert all(f["observed"] for f in result.failed_expectations)


def test_click_rate_bound(clean_frames, docs_dir):
    df = clean_frames["events"].with_columns(click=pl.lit(1, pl.Int8))
    result = V.validate_frame("events", df, partition_key="all_clicks", docs_dir=docs_dir)
    assert ("expect_column_mean_to_be_between", "click") in _failed(result)


def test_sampling_above_max_rows(clean_frames, docs_dir):
    df = clean_frames["events"]
    result = V.validate_frame("events", df, partition_key="sampled", max_rows=500, docs_dir=docs_dir, seed=3)
    assert result.success and result.sampled
    assert result.rows_validated == 500 and result.rows_total == df.height
    assert result.to_metadata()["sampled"] is True
    exact = V.validate_frame("events", df, partition_key="sampled", max_rows=df.height, docs_dir=docs_dir)
    assert not exact.sampled and exact.rows_validated == df.height


def test_data_docs_written(tmp_path, clean_frames):
    docs = tmp_path / "docs"
    ok = V.validate_frame("oracle", clean_frames["oracle"], partition_key="2026-01-05|shops", docs_dir=docs)
    bad = V.validate_frame(
        "events",
        clean_frames["events"].with_columns(click=pl.lit(7, pl.Int8)),
        partition_key="2026-01-05|feed",
        docs_dir=docs,
    )
    index = docs / "index.html"
    assert ok.docs_index == bad.docs_index == str(index)
    html = index.read_text()
    assert "oracle" in html and "events" in html and "2026-01-05_feed" in html
    assert list((docs / "validations" / "events").rglob("*.html"))
    assert (docs / "expectations" / "events.html").exists()


def test_old_runs_of_a_partition_are_pruned(tmp_path, clean_frames, monkeypatch):
    monkeypatch.setattr(V, "KEEP_RUNS_PER_PARTITION", 2)
    docs = tmp_path / "docs"
    for _ in range(4):
        V.validate_frame("oracle", clean_frames["oracle"], partition_key="p1", docs_dir=docs)
    V.validate_frame("oracle", clean_frames["oracle"], partition_key="p2", docs_dir=docs)
    assert len(list((docs / "validations" / "oracle" / "oracle__p1").iterdir())) == 2
    assert len(list((docs / V.STORES_SUBDIR / "validations" / "oracle" / "oracle__p1").iterdir())) == 2
    assert len(list((docs / "validations" / "oracle" / "oracle__p2").iterdir())) == 1


def test_index_is_plain_html_linking_each_partition_page(tmp_path, clean_frames):
    from pathlib import Path

    docs = tmp_path / "docs"
    results = [V.validate_frame("oracle", clean_frames["oracle"], partition_key=f"2026-01-0{i}|shops", docs_dir=docs)
               for i in (5, 6)]
    index = (docs / "index.html").read_text()
    assert "<script" not in index and "https://" not in index  # nothing to fetch: reads offline
    links = re.findall(r'href="([^"]+)"', index)
    assert all((docs / link).exists() for link in links)
    for r in results:
        page = Path(r.page)
        assert page.relative_to(docs).as_posix() in links
        assert r.partition_key.replace("|", "_") in page.read_text()  # the partition's own page, not the index


def test_failure_keeps_its_unexpected_values_and_counts(tmp_path, clean_frames):
    """Suites run in BASIC: a failed expectation's unexpected count and values reach the check metadata, the
    stored result and the page; a passing one keeps its count (0) for the page."""
    from pathlib import Path

    docs = tmp_path / "docs"
    df = clean_frames["events"]
    bad = df.with_columns(click=pl.when(pl.int_range(pl.len()) < 3).then(7).otherwise(pl.col("click")).cast(pl.Int8))
    result = V.validate_frame("events", bad, partition_key="2026-01-05|feed", docs_dir=docs)
    (click,) = [f for f in result.failed_expectations if f["expectation"] == "expect_column_values_to_be_in_set"]
    assert click["column"] == "click" and click["observed"].startswith("3 unexpected") and "[7, 7, 7]" in click["observed"]
    stored = json.loads(next((docs / V.STORES_SUBDIR / "validations" / "events").rglob("*.json")).read_text())
    by_type = {(r["expectation_config"]["type"], r["expectation_config"]["kwargs"].get("column")): r
               for r in stored["results"]}
    detail = by_type[("expect_column_values_to_be_in_set", "click")]["result"]
    assert not by_type[("expect_column_values_to_be_in_set", "click")]["success"]
    assert detail["unexpected_count"] == 3 and detail["partial_unexpected_list"] == [7, 7, 7]
    assert by_type[("expect_column_values_to_not_be_null", "request_id")]["result"]["unexpected_count"] == 0
    assert stored["statistics"]["unsuccessful_expectations"] == result.evaluated - result.successful == 1
    assert "7" in Path(result.page).read_text()  # the page renders the detailed result


def test_memoised_gx_gives_the_results_of_plain_gx(clean_frames, docs_dir, monkeypatch):
    """gx_memo caches configurations, filters, ids and metric graphs between and within runs: a clean and a
    broken partition, alternately, give exactly what GX gives without it (verdicts, counts, observed values)."""
    import contextlib

    from gem_pipelines.data import gx_memo

    broken = clean_frames["events"].with_columns(pl.col("bid") * -1, device=pl.lit("toaster"),
                                                 click=pl.lit(7, pl.Int8))

    def run() -> list[tuple]:
        out = []
        for frame in (clean_frames["events"], broken, clean_frames["events"], broken):
            r = V.validate_frame("events", frame, partition_key="2026-01-05|feed", docs_dir=docs_dir, build=False)
            out.append((r.success, r.evaluated, r.successful,
                        sorted((f["expectation"], str(f["column"]), f["observed"]) for f in r.failed_expectations)))
        return out

    memoised = run()
    monkeypatch.setattr(gx_memo, "memoised", contextlib.nullcontext)
    plain = run()
    assert memoised == plain
    assert memoised[0][0] and not memoised[1][0] and len(memoised[1][3]) >= 3


_EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def test_data_docs_pages_read_offline_and_show_every_observed_value(tmp_path, clean_frames):
    """Every written page (partition, suite, index) is self-contained: no script and no src/href to another
    host. A partition's page shows every expectation with its status and observed value."""
    import html as H
    from pathlib import Path

    from gem_pipelines.data.docs_view import FAILED, PASSED, observed

    docs = tmp_path / "docs"
    bad = clean_frames["events"].with_columns(click=pl.lit(7, pl.Int8), device=pl.lit("toaster"))
    ok = V.validate_frame("oracle", clean_frames["oracle"], partition_key="2026-01-05|shops", docs_dir=docs)
    failed = V.validate_frame("events", bad, partition_key="2026-01-05|feed", docs_dir=docs)
    pages = list(docs.rglob("*.html"))
    assert len(pages) == 5  # two partition pages, two suite pages, the index
    for page in pages:
        text = page.read_text()
        assert "<script" not in text and not _EXTERNAL.search(text), page
        assert all((page.parent / link).exists() for link in re.findall(r'href="([^"#]+)"', text)), page
    for r in (ok, failed):
        text = Path(r.page).read_text()
        results = r.gx_result["results"]
        assert text.count(PASSED) == r.successful + (1 if r.success else 0)  # each row, and the summary line
        assert text.count(FAILED) == r.evaluated - r.successful + (0 if r.success else 1)
        for res in results:
            assert H.escape(observed(res, 2000)) in text, res["expectation_config"]
        assert all(observed(res) not in ("passed", "failed") for res in results)  # a value, not just a verdict
    text = Path(failed.page).read_text()
    assert "2000 unexpected (100%), e.g. [7, 7, 7, 7, 7]" in text
    assert "&quot;toaster&quot;" in text


def test_gx_internals_that_gx_memo_relies_on():
    """gx_memo.py is the one module using Great Expectations internals, written against the version pinned in
    pyproject.toml. It fails here, not silently, when an upgrade moves or reshapes what it wraps."""
    import inspect
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from gem_pipelines.data import gx_memo

    pins = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert f"great-expectations=={gx_memo.GX_VERSION}" in pins["dependencies"]
    assert version("great-expectations") == gx_memo.GX_VERSION
    for (module, qualname), params in gx_memo.RELIED_ON.items():
        obj = __import__(module, fromlist=["_"])
        for part in qualname.split("."):
            obj = getattr(obj, part)
        fn = obj.fget if isinstance(obj, property) else obj
        assert list(inspect.signature(fn).parameters) == params, (module, qualname)


def test_gx_still_calls_what_gx_memo_wraps(clean_frames, docs_dir):
    """Inside `memoised()` every wrapped GX call is reached during one suite run: else the memo would quietly
    stop memoising after an upgrade (the results stay GX's own either way)."""
    from gem_pipelines.data import gx_memo

    gx_memo.hits.clear()
    V.validate_frame("events", clean_frames["events"], partition_key="p", build=False, docs_dir=docs_dir)
    assert set(gx_memo.hits) == gx_memo.WRAPPED, gx_memo.hits


def test_a_datasets_context_columns_close_the_ordered_column_list(monkeypatch, docs_dir):
    """features.yaml `context: true` columns follow the unified schema's: the events suite expects them last,
    so a partition that lacks one, or carries it elsewhere, fails the blocking suite."""
    from gem_model.config import FeaturesConfig

    features = FeaturesConfig.model_validate({
        "dense": [{"name": "word_count", "context": True}],
        "sparse": [{"name": "genre", "table": "genre", "buckets": 8, "context": True}],
        "history": {"max_len": 4, "lookback_days": 1, "columns": []},
    })
    monkeypatch.setattr(V, "load_features", lambda: features)
    frame = events_frame(200).with_columns(word_count=pl.lit(3.0), genre=pl.lit("sport"))
    assert V.validate_frame("events", frame, partition_key="ctx", docs_dir=docs_dir).success
    for bad in (frame.drop("genre"), frame.select("genre", *frame.columns[:-1])):
        result = V.validate_frame("events", bad, partition_key="ctx_bad", docs_dir=docs_dir)
        assert not result.success
        assert [f["expectation"] for f in result.failed_expectations] == ["expect_table_columns_to_match_ordered_list"]
