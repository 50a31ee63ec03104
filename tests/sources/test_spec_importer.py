"""A layout no built-in dataset has, imported by a spec alone: a gzipped TSV with epoch seconds in a
non-UTC timezone, prefixed user ids, an item side table in Parquet (whose columns may become context
features), and rows broken the ways real logs break. Every row is imported or quarantined with its reason;
the window comes from the data."""

from __future__ import annotations

import datetime as dt
import gzip
from pathlib import Path

import polars as pl
import pytest
import yaml

from gem_model.config import ConfigError, FeaturesConfig, Surface, SurfacesConfig, _load, load_calendar
from gem_model.store.schemas import events_schema
from gem_pipelines.data.normalize import normalize_partition
from gem_pipelines.data.parsers import stage_partition
from gem_pipelines.sources import check_context
from gem_pipelines.sources.common import SourceConfig
from gem_pipelines.sources.spec import import_spec
from tests.sources.helpers import account

TZ = dt.timezone(dt.timedelta(hours=-5))  # the spec's "-05:00"
HEAD = "uid\tnews\tslot\tepoch\tclicked\tbought"
SPEC = {
    "default_dir": "unused",
    "files": {"all": ["events_*.tsv.gz"]},
    "read": {"format": "tsv"},
    "columns": {"user": {"column": "uid", "strip_prefix": "U"}, "item": "news", "surface": "slot",
                "click": "clicked", "conversion": "bought"},
    "time": {"column": "epoch", "unit": "s", "timezone": "-05:00", "last_day": "2024-03-05"},
    "side_tables": [{"file": "items.parquet", "joins": "item", "key": "news_id", "read": {"format": "parquet"}}],
    "fields": {"advertiser_id": "publisher"},
    "duplicates": "quarantine",
    "surfaces": {"a": "slot_a", "b": "slot_b"},
}
SURFACES = SurfacesConfig(surfaces=tuple(
    Surface(name=n, domain="news", format="jsonl_nested", traffic_share=0.5, tasks=("click", "conversion"))
    for n in ("slot_a", "slot_b")))


def _epoch(day: int, hour: int) -> int:
    """Local (UTC-5) 2024-03-<day> <hour>:30 as epoch seconds."""
    return int(dt.datetime(2024, 3, day, hour, 30, tzinfo=TZ).timestamp())


def _write(src: Path) -> dict[int, str]:
    """Two good rows a day on each slot for March 1-5, and the broken rows: file line -> reason."""
    src.mkdir()
    lines = [HEAD]
    for day in range(1, 6):
        for k, slot in enumerate("abab"):
            lines.append(f"U{10 + k}\t{100 + day * 10 + k}\t{slot}\t{_epoch(day, 22 if k == 0 else 9)}\t{k % 2}\t0")
    lines.append(lines[3])  # an exact copy of an earlier line
    bad = {len(lines): "duplicate_record"}  # file line = list index + 1
    broken = [
        (f"U20\t201\ta\t{_epoch(2, 10)}\t1", "unparseable"),  # a field short
        ("U20\t201\ta\tyesterday\t1\t0", "unparseable"),  # an unreadable time
        (f"U20\t201\tz\t{_epoch(2, 10)}\t1\t0", "unknown_enum"),  # a slot the spec does not map
        (f"U20\t201\tb\t{_epoch(6, 10)}\t1\t0", "out_of_range_ts"),  # after the spec's last day
        (f"Ux\t201\tb\t{_epoch(3, 10)}\t1\t0", "bad_type"),  # a user id that is no number
        (f"U21\t999\tb\t{_epoch(3, 11)}\t1\t0", "missing_id"),  # an item the side table lacks: no publisher
    ]
    for text, reason in broken:
        lines.append(text)
        bad[len(lines)] = reason
    (src / "events_march.tsv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (src / "events_notes.txt").write_text("not matched by the glob\n")
    items = sorted({int(ln.split("\t")[1]) for ln in lines[1:] if ln.split("\t")[1] != "999"})
    pl.DataFrame({
        "news_id": [str(i) for i in items], "publisher": [str(7000 + i % 3) for i in items],
        "genre": ["sport" if i % 2 else "politics" for i in items],  # context columns (test_context_columns)
        "words": ["many" if i == 153 else str(i * 2) for i in items],
    }).write_parquet(src / "items.parquet")
    return bad


def _import(tmp_path: Path, spec: dict, context: dict[str, str] | None = None) -> tuple[Path, dict, pl.DataFrame]:
    """Import by the spec alone, then the unchanged parsers and row rules on every partition."""
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump(spec))
    cfg = _load(SourceConfig, path)
    home = tmp_path / "home"
    result = import_spec(tmp_path / "src", cfg, SURFACES, None, home, dataset="fixture")
    calendar = load_calendar(home / "imports" / "fixture" / "calendar.yaml")
    parts = {}
    for day in calendar.dates():
        for s in SURFACES.surfaces:
            stage = stage_partition(s.format, home / "landing" / s.name / day.isoformat(), list(context or ()))
            parts[(day, s.name)] = normalize_partition(stage, s, day, context)
    return home, {"result": result, "calendar": calendar, "parts": parts}, account("fixture", home, parts)


def test_a_new_layout_is_imported_by_its_spec_alone(tmp_path: Path) -> None:
    bad = _write(tmp_path / "src")
    home, out, table = _import(tmp_path, SPEC)
    cal = out["calendar"]
    assert (cal.start, cal.end()) == (dt.date(2024, 3, 1), dt.date(2024, 3, 5))  # the data's first day .. last_day
    assert table.to_dicts() == [{"source_file": "events_march.tsv.gz", "read": 20 + 1 + 6, "imported": 20,
                                 "quarantined": 7}]
    q = pl.concat([p.quarantine for p in out["parts"].values()])
    lineage = pl.read_parquet(home / "imports" / "fixture" / "lineage.parquet")
    q = q.join(lineage, left_on=["surface", "date", "line_no"], right_on=["surface", "date", "feed_line"])
    assert dict(zip(q["line_no_right"].to_list(), q["reason"].to_list(), strict=True)) == bad

    events = pl.concat([p.events for p in out["parts"].values()])
    first = events.filter(pl.col("request_id") == "events_march.tsv.gz:2").row(0, named=True)
    # local 22:30 on March 1 (03:30 UTC on March 2): the row's day and hour are the data's local ones
    assert (first["date"], first["hour_of_day"], first["surface"]) == (dt.date(2024, 3, 1), 22, "slot_a")
    assert (first["user_id"], first["ad_id"], first["advertiser_id"]) == (10, 110, 7000 + 110 % 3)
    assert events["conversion"].to_list() == [0] * 20 and events["click"].sum() == 10


def test_the_window_follows_the_data_without_bounds(tmp_path: Path) -> None:
    """No last_day: the window ends on the data's last day (a longer copy moves E), so the March 6 row
    is inside it."""
    _write(tmp_path / "src")
    spec = {**SPEC, "time": {k: v for k, v in SPEC["time"].items() if k != "last_day"}}
    _, out, table = _import(tmp_path, spec)
    assert out["calendar"].end() == dt.date(2024, 3, 6) and out["calendar"].roles().evaluation == dt.date(2024, 3, 6)
    assert table["imported"].item() == 21 and table["quarantined"].item() == 6


def test_a_spec_refuses_unknown_keys_naming_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "columns": {**SPEC["columns"], "colour": "x"}}))
    with pytest.raises(ConfigError, match=r"source\.yaml.*columns\.colour"):
        _load(SourceConfig, path)
    path.write_text(yaml.safe_dump({**SPEC, "time": {**SPEC["time"], "timezone": "Mars/Olympus"}}))
    with pytest.raises(ConfigError, match=r"time\.timezone"):
        _load(SourceConfig, path)
    path.write_text(yaml.safe_dump({**SPEC, "files": {"all": ["../events_*.tsv.gz"]}}))
    with pytest.raises(ConfigError, match="files"):
        _load(SourceConfig, path)


def test_context_columns_land_typed_and_a_bad_dense_value_is_quarantined(tmp_path: Path) -> None:
    """source.yaml `context` lands a side table's columns in `events` after the unified schema: a
    categorical one as text, a dense one as a number; a dense value that is no number is bad_type."""
    _write(tmp_path / "src")
    spec = {**SPEC, "context": {"genre": "genre", "word_count": "words"}}
    context = {"genre": "categorical", "word_count": "dense"}
    _, out, table = _import(tmp_path, spec, context)
    assert table["imported"].item() == 19 and table["quarantined"].item() == 8  # item 153's row is bad_type now
    events = pl.concat([p.events for p in out["parts"].values()])
    assert dict(events.schema) == events_schema(context) and list(events.columns[-2:]) == ["genre", "word_count"]
    first = events.filter(pl.col("request_id") == "events_march.tsv.gz:2").row(0, named=True)
    assert (first["ad_id"], first["genre"], first["word_count"]) == (110, "politics", 220.0)
    q = pl.concat([p.quarantine for p in out["parts"].values()])
    assert q.filter(pl.col("raw").str.contains('"word_count":"many"'))["reason"].to_list() == ["bad_type"]
    # without the context the same landing still ingests (item 153's row too): the extra object is not read
    plain = normalize_partition(stage_partition("jsonl_nested", tmp_path / "home" / "landing" / "slot_b" / "2024-03-05"),
                                SURFACES.get("slot_b"), dt.date(2024, 3, 5))
    assert "genre" not in plain.events.columns and 153 in plain.events["ad_id"].to_list()
    assert plain.reasons == {"out_of_range_ts": 1}  # the March 6 row, as without context


def test_a_context_column_needs_its_feature_and_a_legal_name(tmp_path: Path) -> None:
    clash = FeaturesConfig.model_validate({**_features(), "dense": [{"name": "bid", "context": True}]})
    with pytest.raises(ValueError, match=r"\['bid'\] name columns of the unified schema"):
        events_schema(clash.context)
    with pytest.raises(ValueError, match="must match"):
        FeaturesConfig.model_validate({**_features(), "dense": [{"name": "Words", "context": True}]})
    ok = FeaturesConfig.model_validate({**_features(), "dense": [{"name": "word_count", "transform": "log1p", "context": True}],
                                        "sparse": [{"name": "genre", "table": "genre", "buckets": 16, "context": True}]})
    assert ok.context == {"word_count": "dense", "genre": "categorical"}
    with pytest.raises(ValueError, match="only the jsonl_nested landing"):
        stage_partition("csv_ms", tmp_path, ["genre"])
    with pytest.raises(ValueError, match="only the generic importer"):
        SourceConfig.model_validate({**SPEC, "importer": "taobao", "context": {"genre": "genre"}})
    cfg = SourceConfig.model_validate({**SPEC, "context": {"genre": "genre"}})
    with pytest.raises(ConfigError, match=r"maps \['genre'\] but .*features\.yaml marks \[\]"):
        check_context("douban", cfg)  # Douban's features.yaml declares no context column
    with pytest.raises(ConfigError, match=r"go in its own .*sources/mind/features\.yaml, a copy of"):
        check_context("mind", cfg)  # MIND reads the shared features.yaml: the error says where to declare them


def _features() -> dict:
    return {"dense": [], "sparse": [], "history": {"max_len": 4, "lookback_days": 1, "columns": []}}
