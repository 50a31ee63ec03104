"""Each raw format parsed; each class of malformed record quarantined with its reason; nothing lost;
partition-exact, idempotent and atomic Delta writes."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from gem_model.config import Surface
from gem_model.store.paths import table_uri
from gem_pipelines.data import lake
from gem_pipelines.data.formats import EVENTS_SCHEMA, REASON_CODES
from gem_pipelines.data.ingest import conservation, ingest_partition
from gem_pipelines.data.normalize import normalize_partition
from gem_pipelines.data.parsers import ContainerError, count_raw_records, stage_partition

D = dt.date(2026, 11, 1)
T0 = dt.datetime(2026, 11, 1, 8, 0, tzinfo=dt.UTC)
FEED = Surface(name="feed", domain="social", format="jsonl_nested", traffic_share=0.5)
REELS = Surface(name="reels", domain="social", format="event_stream", traffic_share=0.2, tasks=("click",))
MARKET = Surface(name="marketplace", domain="commerce", format="csv_ms", traffic_share=0.2)
SHOPS = Surface(name="shops", domain="commerce", format="parquet", traffic_share=0.1)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def feed_ad(i: int, **over: object) -> dict:
    rec = {
        "kind": "ad",
        "request_id": f"feed-{i}",
        "ts": iso(T0 + dt.timedelta(minutes=i)),
        "user": {"id": 100 + i, "device": "ios", "tenure_days": 12.5},
        "ad": {"id": 7, "advertiser_id": 3, "objective": "traffic", "creative_format": "video", "bid": 1.5},
        "slot": {"position": 2},
        "engagement": {"click": i % 2 == 0, "click_ts": iso(T0 + dt.timedelta(minutes=i, seconds=5)) if i % 2 == 0 else None,
                       "conversion": False, "conversion_ts": None},
    }
    rec.update(over)
    return rec


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def landing(gem_home: Path) -> Path:
    return gem_home / "landing"


def make_feed(landing: Path) -> dict[int, str]:
    good = [json.dumps(feed_ad(i)) for i in range(6)]
    organic = json.dumps({"kind": "organic", "ts": iso(T0), "user": {"id": 5}, "item_id": 9001, "action": "like"})
    bad = {
        "truncated": json.dumps(feed_ad(10))[:40],
        "unparseable": "this is not json",
        "missing_id": json.dumps(feed_ad(11, request_id="")),
        "bad_type": json.dumps(feed_ad(12, ad={"id": 7, "advertiser_id": 3, "objective": "traffic",
                                                "creative_format": "video", "bid": "abc"})),
        "out_of_range_ts": json.dumps(feed_ad(13, ts=iso(T0 - dt.timedelta(days=2)))),
        "unknown_enum": json.dumps({"kind": "organic", "ts": iso(T0), "user": {"id": 5}, "item_id": 1, "action": "poke"}),
        "duplicate_record": good[0],
    }
    lines = good + [organic] + list(bad.values())
    write(landing / "feed" / D.isoformat() / "feed.jsonl", lines)
    return {len(good) + 2 + i: reason for i, reason in enumerate(bad)}


def test_jsonl_nested_quarantines_each_malformed_line_with_its_reason(landing: Path) -> None:
    expected = make_feed(landing)
    stage = stage_partition("jsonl_nested", landing / "feed" / D.isoformat())
    norm = normalize_partition(stage, FEED, D)
    got = dict(zip(norm.quarantine["line_no"], norm.quarantine["reason"], strict=True))
    assert got == expected
    assert norm.events.height == 6 and norm.organic.height == 1
    assert norm.events["click"].to_list() == [1, 0, 1, 0, 1, 0]
    assert dict(norm.events.schema) == EVENTS_SCHEMA
    assert set(norm.quarantine["reason"]) <= set(REASON_CODES)
    # the raw text is kept verbatim
    assert norm.quarantine.filter(pl.col("reason") == "unparseable")["raw"].item() == "this is not json"
    c = norm.counts()
    assert c["raw_records"] == c["impressions"] + c["organic"] + c["quarantined"] == 14


def stream_line(event: str, rid: str | None, t: dt.datetime, payload: dict | None = None) -> str:
    rec: dict = {"event": event, "ts": t.timestamp()}
    if rid is not None:
        rec["request_id"] = rid
    if payload is not None:
        rec["payload"] = payload
    return json.dumps(rec)


IMP_PAYLOAD = {"user_id": 1, "device": "android", "tenure_days": 3.0, "ad_id": 4, "advertiser_id": 2,
               "objective": "awareness", "creative_format": "image", "position": 1, "bid": 0.3}


def test_event_stream_joins_clicks_and_quarantines_orphans_and_duplicates(landing: Path) -> None:
    late = T0 + dt.timedelta(hours=20)  # the click crosses midnight: allowed, filed under D
    lines = [
        stream_line("impression", "r1", T0, IMP_PAYLOAD),
        stream_line("impression", "r2", T0 + dt.timedelta(minutes=1), {**IMP_PAYLOAD, "user_id": 2}),
        stream_line("click", "r1", late),
        stream_line("click", "r1", late),  # duplicate click
        stream_line("click", "nope", T0),  # orphan
        stream_line("conversion", "r2", T0 + dt.timedelta(minutes=2)),  # reels logs no conversions
        stream_line("organic", None, T0, {"user_id": 1, "item_id": 3000, "action": "view"}),
        stream_line("impression", "r3", T0, {**IMP_PAYLOAD, "device": "smart_fridge"}),
        stream_line("teleport", "r4", T0),
        stream_line("click", "r2", T0 + dt.timedelta(days=2)),  # too late: > 24 h after impression
    ]
    write(landing / "reels" / D.isoformat() / "events.jsonl", lines)
    norm = normalize_partition(stage_partition("event_stream", landing / "reels" / D.isoformat()), REELS, D)
    got = dict(zip(norm.quarantine["line_no"], norm.quarantine["reason"], strict=True))
    assert got == {4: "duplicate_record", 5: "orphan_event", 6: "unexpected_label", 8: "unknown_enum",
                   9: "unknown_enum", 10: "out_of_range_ts"}
    ev = norm.events.sort("request_id")
    assert ev["request_id"].to_list() == ["r1", "r2"]
    assert ev["click"].to_list() == [1, 0]
    assert ev["conversion"].null_count() == 2  # no conversion task on this surface
    assert norm.merged_label_events == 1
    assert norm.paid.height == 1 and norm.paid["ts"].item() == late
    c = norm.counts()
    assert c["raw_records"] == c["impressions"] + c["merged_label_events"] + c["organic"] + c["quarantined"]


def test_csv_ms_handles_ragged_lines_and_epoch_ms(landing: Path) -> None:
    d = landing / "marketplace" / D.isoformat()
    ms = int(T0.timestamp() * 1000)
    header = "req_id,event_time_ms,uid,device_type,tenure_d,ad,advertiser,objective,format,slot,bid_usd,clicked,click_time_ms,converted,conversion_time_ms"
    rows = [
        f"m1,{ms},1,web,1.0,5,2,conversions,carousel,3,0.9,1,{ms + 4000},1,{ms + 60000}",
        f"m2,{ms},2,web,1.0,5,2,conversions,carousel,3,0.9,0,,0,",
        f"m3,{ms},2,web,1.0,5,2,conversions,carousel",  # truncated
        f"m4,{ms},2,web,1.0,5,2,conversions,carousel,3,0.9,0,,0,,extra",  # unparseable
        f"m5,{ms},,web,1.0,5,2,conversions,carousel,3,0.9,0,,0,",  # missing user id
        f"m6,{ms},2,web,1.0,5,2,conversions,carousel,2.5x,0.9,0,,0,",  # bad type
        f"m7,{ms},2,web,1.0,5,2,conversions,carousel,3,-4,0,,0,",  # negative bid
        f'"m8,{ms},2,web',  # broken quoting
    ]
    write(d / "impressions.csv", [header, *rows])
    write(d / "activity.csv", ["uid,event_time_ms,item,action", f"1,{ms},3001,share", f"1,{ms},3001,share"])
    norm = normalize_partition(stage_partition("csv_ms", d), MARKET, D)
    got = {(f, n): r for f, n, r in norm.quarantine.select("source_file", "line_no", "reason").iter_rows()}
    assert got == {
        ("impressions.csv", 4): "truncated",
        ("impressions.csv", 5): "unparseable",
        ("impressions.csv", 6): "missing_id",
        ("impressions.csv", 7): "bad_type",
        ("impressions.csv", 8): "out_of_range_value",
        ("impressions.csv", 9): "unparseable",
        ("activity.csv", 3): "duplicate_record",
    }
    m1 = norm.events.filter(pl.col("request_id") == "m1").row(0, named=True)
    assert m1["ts"] == T0 and m1["conversion"] == 1 and m1["click_ts"] == T0 + dt.timedelta(seconds=4)
    assert count_raw_records("csv_ms", d) == norm.raw_records == 10


def test_parquet_rows_are_records_and_unreadable_file_fails_naming_it(landing: Path) -> None:
    d = landing / "shops" / D.isoformat()
    d.mkdir(parents=True)
    n = 4
    imps = pl.DataFrame(
        {
            "request_id": ["s1", "s2", "s2", None],
            "ts": [T0] * n,
            "user_id": [1, 2, 3, 4],
            "device": ["ios", "ios", "ios", "ios"],
            "user_tenure_days": [1.0] * n,
            "ad_id": [1] * n,
            "advertiser_id": [1] * n,
            "objective": ["traffic", "traffic", "traffic", "traffic"],
            "creative_format": ["image"] * n,
            "position": pl.Series([1] * n, dtype=pl.Int32),
            "bid": [0.5] * n,
            "click": [False] * n,
            "click_ts": pl.Series([None] * n, dtype=pl.Datetime("us", "UTC")),
            "conversion": [False] * n,
            "conversion_ts": pl.Series([None] * n, dtype=pl.Datetime("us", "UTC")),
        }
    )
    imps.write_parquet(d / "impressions.parquet")
    pl.DataFrame({"user_id": [1], "ts": [T0], "item_id": [3000], "action": ["save"]}).write_parquet(d / "activity.parquet")
    norm = normalize_partition(stage_partition("parquet", d), SHOPS, D)
    got = dict(zip(norm.quarantine["line_no"], norm.quarantine["reason"], strict=True))
    assert got == {3: "duplicate_record", 4: "missing_id"}
    assert json.loads(norm.quarantine["raw"][0])["request_id"] == "s2"
    (d / "activity.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ContainerError, match="activity.parquet"):
        stage_partition("parquet", d)


def test_ingest_is_partition_exact_idempotent_and_conserves_records(landing: Path) -> None:
    make_feed(landing)
    first = ingest_partition(FEED, D, landing, validate=False)
    again = ingest_partition(FEED, D, landing, validate=False)
    assert again.versions["events"] > first.versions["events"]
    events = pl.read_delta(table_uri("events"))
    assert events.height == 6 and events["request_id"].is_unique().all()
    assert conservation(FEED, D, landing)["missing"] == 0
    # another partition of the same table is untouched by re-ingesting this one
    other = D + dt.timedelta(days=1)
    (landing / "feed" / other.isoformat()).mkdir(parents=True)
    (landing / "feed" / other.isoformat() / "feed.jsonl").write_text(
        json.dumps(feed_ad(1, ts=iso(T0 + dt.timedelta(days=1)))) + "\n"
    )
    ingest_partition(FEED, other, landing, validate=False)
    ingest_partition(FEED, D, landing, validate=False)
    counts = dict(pl.read_delta(table_uri("events")).group_by("date").len().iter_rows())
    assert counts == {D: 6, other: 1}


def test_failed_write_leaves_previous_version_readable(landing: Path) -> None:
    make_feed(landing)
    ingest_partition(FEED, D, landing, validate=False)
    before = DeltaTable(table_uri("events")).version()
    rows_before = pl.read_delta(table_uri("events")).height
    bad = pl.read_delta(table_uri("events")).with_columns(pl.col("click").cast(pl.Float64) + 0.7)
    with pytest.raises(lake.SchemaMismatch):
        lake.write_partition(bad, "events", {"date": D, "surface": "feed"}, EVENTS_SCHEMA)
    wrong_partition = pl.read_delta(table_uri("events")).with_columns(surface=pl.lit("reels"))
    with pytest.raises(ValueError, match="outside partition"):
        lake.write_partition(wrong_partition.select(list(EVENTS_SCHEMA)), "events", {"date": D, "surface": "feed"}, EVENTS_SCHEMA)
    assert DeltaTable(table_uri("events")).version() == before
    assert pl.read_delta(table_uri("events")).height == rows_before


def test_missing_landing_directory_is_a_clear_error(landing: Path) -> None:
    with pytest.raises(ContainerError, match="no landing directory"):
        stage_partition("jsonl_nested", landing / "feed" / "2026-01-01")


@pytest.mark.parametrize("surface", ["feed", "reels", "marketplace", "shops"])
def test_simulated_partition_quarantines_exactly_the_injected_corruption(landing: Path, surface: str) -> None:
    from gem_model.config import load_simulator, load_surfaces
    from gem_pipelines.data.simulator import simulate_partition

    surfaces = load_surfaces()
    cfg = load_simulator(impressions_per_day=8000, corruption_rate=0.005)
    sim = simulate_partition(cfg, surfaces, surface, D, landing)
    result = ingest_partition(surfaces.get(surface), D, landing, validate=False)
    assert result.normalized.reasons == {k: v for k, v in sim.n_corrupted.items() if v}
    assert len(result.normalized.reasons) >= 4
    counts = conservation(surfaces.get(surface), D, landing)
    assert counts["missing"] == 0 and counts["raw_records"] == result.normalized.raw_records


def test_failing_blocking_suite_commits_nothing(landing: Path) -> None:
    from gem_pipelines.data.ingest import SuiteFailed

    make_feed(landing)
    ingest_partition(FEED, D, landing, validate=False)
    versions = {t: DeltaTable(table_uri(t)).version() for t in ("events", "user_activity", "events_quarantine")}
    # every impression clicked: row rules accept each record, the table-level suite (click rate <= 20%) must not
    lines = [json.dumps(feed_ad(i, engagement={"click": True, "click_ts": iso(T0 + dt.timedelta(minutes=i, seconds=3)),
                                                "conversion": False, "conversion_ts": None})) for i in range(20)]
    write(landing / "feed" / D.isoformat() / "feed.jsonl", lines)
    with pytest.raises(SuiteFailed, match="click") as failed:
        ingest_partition(FEED, D, landing, docs_dir=landing.parent / "docs")
    assert not failed.value.results["events"].success
    assert {t: DeltaTable(table_uri(t)).version() for t in versions} == versions
    assert pl.read_delta(table_uri("events"))["click"].to_list() == [1, 0, 1, 0, 1, 0]


def test_validated_ingest_renders_data_docs_once_with_a_page_per_suite(landing: Path, monkeypatch) -> None:
    from gem_pipelines.data import validation as V

    make_feed(landing)
    builds: list[list[str]] = []
    real = V.build_docs
    monkeypatch.setattr(V, "build_docs", lambda results, docs_dir=None: (builds.append([r.table for r in results]),
                                                                       real(results, docs_dir))[1])
    docs = landing.parent / "docs"
    from gem_pipelines.data.ingest import SuiteFailed

    with pytest.raises(SuiteFailed) as failed:  # make_feed clicks half the impressions: the suite fails
        ingest_partition(FEED, D, landing, docs_dir=docs)
    suites = failed.value.results  # a failing partition has its pages too: that is where to look
    assert builds == [list(suites)] and len(suites) == 3  # one build for all the run's suites
    for table, suite in suites.items():
        page = Path(suite.page)
        assert page.is_relative_to(docs / "validations" / table) and f"{table}__{D.isoformat()}_feed" in str(page)
        assert page.exists()


def test_row_rules_quarantine_each_record_the_blocking_suites_would_refuse(landing: Path) -> None:
    """One record outside a per-row expectation of the events/user_activity suites is quarantined; the
    other rows pass the suites and commit (before, the suite failed and blocked all of them)."""
    from gem_pipelines.data.validation import suite_path

    ranges = {e["kwargs"]["column"]: (e["kwargs"].get("min_value"), e["kwargs"].get("max_value"))
              for e in json.loads(suite_path("events").read_text())["expectations"]
              if e["type"] == "expect_column_values_to_be_between"}
    lo, hi = (int(v) for v in ranges["position"])
    good = [json.dumps(feed_ad(i, engagement={"click": False, "click_ts": None, "conversion": False,
                                               "conversion_ts": None})) for i in range(40)]
    ad = {"id": 7, "advertiser_id": 3, "objective": "traffic", "creative_format": "video", "bid": 1.5}
    user = {"id": 1, "device": "ios", "tenure_days": 12.5}
    bad = [
        feed_ad(50, slot={"position": hi + 1}),
        feed_ad(51, slot={"position": lo - 1}),
        feed_ad(52, engagement={"click": False, "click_ts": None, "conversion": True, "conversion_ts": None}),
        feed_ad(53, ad={**ad, "id": -7}),  # a negative ad id, as a negative user id is
        feed_ad(54, ad={**ad, "advertiser_id": -3}),
        feed_ad(55, ad={**ad, "bid": "NaN"}),  # NaN is null to the suites
        feed_ad(56, user={**user, "tenure_days": "inf"}),
        {"kind": "organic", "ts": iso(T0), "user": {"id": 5}, "item_id": -9001, "action": "like"},
    ]
    write(landing / "feed" / D.isoformat() / "feed.jsonl", good + [json.dumps(r) for r in bad])
    result = ingest_partition(FEED, D, landing, docs_dir=landing.parent / "docs")
    got = dict(zip(result.normalized.quarantine["line_no"], result.normalized.quarantine["reason"], strict=True))
    n = len(good)
    assert got == {n + 3: "bad_type", **{n + k: "out_of_range_value" for k in (1, 2, 4, 5, 6, 7, 8)}}
    assert all(s.success for s in result.suites.values())
    assert pl.read_delta(table_uri("events")).height == n
    assert conservation(FEED, D, landing)["missing"] == 0


@pytest.mark.parametrize("alter", ["extra_column", "other_dtype"])
def test_a_table_of_another_schema_fails_the_ingest_before_any_commit(landing: Path, alter: str) -> None:
    """The lake written by another version: the ingest refuses before committing any of its three tables
    (before, the other two committed), and a dtype delta-rs would cast silently is refused as well."""
    make_feed(landing)
    ingest_partition(FEED, D, landing, validate=False)
    uri = table_uri("events")
    old = pl.read_delta(uri)
    changed = (old.with_columns(ad_quality=pl.lit(0.5)) if alter == "extra_column"
               else old.with_columns(pl.col("position").cast(pl.Int64)))
    changed.write_delta(uri, mode="overwrite", delta_write_options={"schema_mode": "overwrite",
                                                                     "partition_by": ["date", "surface"]})
    tables = ("events", "user_activity", "events_quarantine")
    versions = {t: DeltaTable(table_uri(t)).version() for t in tables}
    with pytest.raises(lake.SchemaMismatch, match="re-materialize"):
        ingest_partition(FEED, D, landing, validate=False)
    assert {t: DeltaTable(table_uri(t)).version() for t in tables} == versions


@pytest.mark.parametrize("surface", ["feed", "marketplace"])
def test_a_line_of_invalid_utf8_is_quarantined_with_its_bytes_kept(landing: Path, surface: str) -> None:
    """Two ids that differ only in an invalid byte stay two records, each quarantined as unparseable with
    its raw bytes visible, not decoded to one replacement character (which merged them)."""
    d = landing / surface / D.isoformat()
    d.mkdir(parents=True)
    if surface == "feed":
        lines = [json.dumps(feed_ad(i, request_id=f"caf{c}")).encode().replace(c.encode(), bytes([b]))
                 for i, (c, b) in enumerate([("Q", 0xE9), ("Z", 0xE8)])]
        (d / "feed.jsonl").write_bytes(b"\n".join([json.dumps(feed_ad(5)).encode(), *lines]) + b"\n")
    else:
        ms = int(T0.timestamp() * 1000)
        header = "req_id,event_time_ms,uid,device_type,tenure_d,ad,advertiser,objective,format,slot,bid_usd,clicked,click_time_ms,converted,conversion_time_ms"
        rows = [f"m{c},{ms},1,web,1.0,5,2,traffic,image,3,0.9,0,,0,".encode().replace(c.encode(), bytes([b]))
                for c, b in [("Q", 0xE9), ("Z", 0xE8)]]
        (d / "impressions.csv").write_bytes(b"\n".join([header.encode(), b"m1,%d,1,web,1.0,5,2,traffic,image,3,0.9,0,,0," % ms, *rows]) + b"\n")
        (d / "activity.csv").write_text("uid,event_time_ms,item,action\n")
    surf = {"feed": FEED, "marketplace": MARKET}[surface]
    norm = normalize_partition(stage_partition(surf.format, d), surf, D)
    assert norm.quarantine["reason"].to_list() == ["unparseable", "unparseable"]
    assert norm.quarantine["line_no"].to_list() == ([2, 3] if surface == "feed" else [3, 4])
    raw = norm.quarantine["raw"].to_list()
    assert "\\xe9" in raw[0] and "\\xe8" in raw[1]
    assert norm.events.height == 1
    assert norm.raw_records == count_raw_records(surf.format, d) == 3
