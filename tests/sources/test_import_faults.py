"""Faults of real source files and specs, on a tiny CSV log imported by a spec: each is either an error
naming the file (before landing/ is touched), or rows quarantined with their reason and counted, so
rows read = imported + quarantined still holds; a failed import is redone in full by the next run."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import yaml

import gem_pipelines.sources as sources
import gem_pipelines.sources.common as common
from gem_model.config import ConfigError, Surface, SurfacesConfig, _load, load_calendar
from gem_pipelines.data.normalize import normalize_partition
from gem_pipelines.data.parsers import stage_partition
from gem_pipelines.sources.common import SourceConfig
from gem_pipelines.sources.spec import import_spec, read_spec
from tests.sources.helpers import account

HEAD = "u,i,s,t,c"
SPEC = {
    "default_dir": "unused",
    "files": {"all": ["log.csv"]},
    "columns": {"user": "u", "item": "i", "surface": "s", "click": "c"},
    "time": {"column": "t", "unit": "s"},
    "surfaces": {"a": "slot_a", "b": "slot_b"},
}
SURFACES = SurfacesConfig(surfaces=tuple(
    Surface(name=n, domain="news", format="jsonl_nested", traffic_share=0.5, tasks=("click",))
    for n in ("slot_a", "slot_b")))


def _epoch(day: int, minute: int = 0) -> int:
    return int(dt.datetime(2024, 3, day, 10, minute, tzinfo=dt.UTC).timestamp())


def _rows(per_day: int = 2) -> list[str]:
    """`per_day` good rows a day on alternate slots, March 1-6."""
    return [f"{d}{k},{k + 1},{'ab'[k % 2]},{_epoch(d, k)},{k % 2}" for d in range(1, 7) for k in range(per_day)]


def _csv(*lines: str) -> str:
    return "\n".join([HEAD, *lines]) + "\n"


def _cfg(tmp_path: Path, spec: dict) -> SourceConfig:
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump(spec))
    return _load(SourceConfig, path)


def _import(tmp_path: Path, files: dict[str, str | bytes], spec: dict = SPEC) -> tuple[Path, object, dict, pl.DataFrame]:
    """Import by the spec, then the unchanged parsers and row rules on every partition: (home, result,
    partitions, the per-file accounting)."""
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (src / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    home = tmp_path / "home"
    result = import_spec(src, _cfg(tmp_path, spec), SURFACES, None, home, dataset="fixture")
    parts = {(day, s.name): normalize_partition(stage_partition(s.format, home / "landing" / s.name / day.isoformat()), s, day)
             for day in load_calendar(home / "imports" / "fixture" / "calendar.yaml").dates() for s in SURFACES.surfaces}
    return home, result, parts, account("fixture", home, parts)


def _quarantine(home: Path, parts: dict) -> pl.DataFrame:
    """Quarantined rows with their source line (line_no_right)."""
    q = pl.concat([p.quarantine for p in parts.values()])
    lineage = pl.read_parquet(home / "imports" / "fixture" / "lineage.parquet")
    return q.join(lineage, left_on=["surface", "date", "line_no"], right_on=["surface", "date", "feed_line"])


def _landing(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted((home / "landing").rglob("*.jsonl"))}


# --- 1. a refused import leaves landing/ as it was; one that fails midway is redone in full


def _dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: dict) -> Path:
    """assets/sources/fixture/ under tmp_path (source.yaml, surfaces.yaml) and its source folder."""
    folder = tmp_path / "assets" / "sources" / "fixture"
    folder.mkdir(parents=True)
    (folder / "source.yaml").write_text(yaml.safe_dump(spec))
    (folder / "surfaces.yaml").write_text(yaml.safe_dump(SURFACES.model_dump(mode="json")))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "log.csv").write_text(_csv(*_rows()))
    for module in (sources, common):
        monkeypatch.setattr(module, "SOURCES_DIR", tmp_path / "assets" / "sources")
    monkeypatch.setenv("GEM_SOURCE_DIR", str(tmp_path / "src"))
    return folder / "source.yaml"


def test_a_spec_naming_an_undeclared_surface_is_refused_before_landing_is_touched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _dataset(tmp_path, monkeypatch, SPEC)
    home = tmp_path / "home"
    assert sources.import_dataset("fixture", home) is not None
    before = _landing(home)
    for key, typo in (("surfaces", {"a": "slot_a", "b": "slot_bb"}), ("val_to_train", {"slot_bb": 0.5}),
                      ("peer_ne", {"slot_bb": 0.9})):
        path.write_text(yaml.safe_dump({**SPEC, key: typo}))
        with pytest.raises(ConfigError, match=rf"source\.yaml: `{key}` names \['slot_bb'\], not declared in surfaces\.yaml"):
            sources.import_dataset("fixture", home)
    # the importer itself (a spec given without load_source) checks every record before its first write
    cfg = _cfg(tmp_path, {**SPEC, "surfaces": {"a": "slot_a", "b": "slot_bb"}})
    with pytest.raises(ValueError, match=r"6 records of surface \['slot_bb'\] not declared in surfaces\.yaml"):
        import_spec(tmp_path / "src", cfg, SURFACES, None, home, dataset="fixture")
    assert _landing(home) == before and sum(v.count(b"\n") for v in before.values()) == 12


def test_an_import_that_fails_midway_is_redone_by_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _dataset(tmp_path, monkeypatch, SPEC)
    home = tmp_path / "home"
    sources.import_dataset("fixture", home)
    write_text, calls = common.write_text, []

    def failing(target: Path, text: str) -> Path:  # the disk fills after the third partition
        calls.append(target)
        if len(calls) > 3:
            raise OSError("No space left on device")
        return write_text(target, text)

    path.write_text(yaml.safe_dump({**SPEC, "seed": 1}))  # any change to the spec: a new import
    monkeypatch.setattr(common, "write_text", failing)
    with pytest.raises(OSError):
        sources.import_dataset("fixture", home)
    assert not (home / "imports" / "fixture" / "fingerprint.json").exists()
    monkeypatch.setattr(common, "write_text", write_text)
    path.write_text(yaml.safe_dump(SPEC))  # back to the spec of the landing before
    assert sources.import_dataset("fixture", home) is not None  # not "landing/ already holds this import"
    assert sources.import_dataset("fixture", home) is None


# --- 2. a row that cannot be read is quarantined, never read as a record


def test_a_row_that_cannot_be_read_is_quarantined_never_read_as_a_record(tmp_path: Path) -> None:
    organic = '"kind":"organic","ts":"2024-03-01T10:00:00Z","user":{"id":"5"},"item_id":"6","action":"view"'
    home, _, parts, table = _import(tmp_path, {"log.csv": _csv(*_rows(), "{" + organic + "}")})
    assert table.to_dicts() == [{"source_file": "log.csv", "read": 13, "imported": 12, "quarantined": 1}]
    assert _quarantine(home, parts)["reason"].to_list() == ["unparseable"]
    assert all(p.organic.is_empty() for p in parts.values())

    # a JSONL record whose time cannot be read: unparseable (as spec.py says), its fields not read either
    jsonl = {**SPEC, "read": {"format": "jsonl"}, "files": {"all": ["log.jsonl"]}}
    records = [json.dumps(dict(zip(HEAD.split(","), r.split(","), strict=True))) for r in _rows()]
    bad = '{"u": 5, "i": 6, "s": "a", "t": "never", "c": 1, ' + organic + "}"
    home, _, parts, table = _import(tmp_path / "j", {"log.jsonl": "\n".join([*records, bad]) + "\n"}, jsonl)
    assert table.to_dicts() == [{"source_file": "log.jsonl", "read": 13, "imported": 12, "quarantined": 1}]
    assert _quarantine(home, parts)["reason"].to_list() == ["unparseable"]
    assert all(p.organic.is_empty() for p in parts.values())


# --- 3. stray times do not stretch the window


def test_a_few_stray_times_are_quarantined_not_the_window(tmp_path: Path) -> None:
    rows = _rows(per_day=20)  # 120 rows: one stray is under 1%
    for k, stray in enumerate(["0", "9223372036854775807", "1709460000000", "-99999999999"]):
        (tmp_path / f"s{k}").mkdir()
        (tmp_path / f"s{k}" / "log.csv").write_text(_csv(*rows, f"5,6,a,{stray},1"))
        got, calendar, _ = read_spec(tmp_path / f"s{k}", _cfg(tmp_path, SPEC), None)
        assert (calendar.start, calendar.days) == (dt.date(2024, 3, 1), 6), stray
    # epoch 0 is a date: out_of_range_ts; int64 max and ms in a seconds column are none: unparseable
    home, _, parts, table = _import(tmp_path, {"log.csv": _csv(*rows, "5,6,a,0,1", "5,6,a,1709460000000,1")})
    assert table.to_dicts() == [{"source_file": "log.csv", "read": 122, "imported": 120, "quarantined": 2}]
    assert dict(zip(*_quarantine(home, parts).select("line_no_right", "reason"), strict=True)) == {
        122: "out_of_range_ts", 123: "unparseable"}
    # more than strays: two periods of data, the spec must choose
    late = [f"9{k},7,a,{_epoch(6) + 90 * 86400 + k},1" for k in range(5)]
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "log.csv").write_text(_csv(*rows, *late))
    with pytest.raises(ValueError, match=r"5 of 125 rows .* log\.csv line 122, day 2024-06-04.*time.first_day / time.last_day"):
        read_spec(tmp_path / "two", _cfg(tmp_path, SPEC), None)
    bounded = {**SPEC, "time": {**SPEC["time"], "last_day": "2024-03-06"}}
    assert read_spec(tmp_path / "two", _cfg(tmp_path, bounded), None)[1].days == 6


# --- 4. invalid UTF-8


def test_a_line_of_invalid_utf8_is_quarantined_not_altered(tmp_path: Path) -> None:
    """Replacing the bad byte would make café (latin-1 \\xe9) and cafè (\\xe8) one hashed id."""
    spec = {**SPEC, "columns": {**SPEC["columns"], "item": {"column": "i", "hash": True}}}
    data = _csv(*_rows()).encode() + f"77,caf\xe9,a,{_epoch(3)},1\n77,caf\xe8,a,{_epoch(3, 5)},0\n".encode("latin-1")
    home, _, parts, table = _import(tmp_path, {"log.csv": data}, spec)
    assert table.to_dicts() == [{"source_file": "log.csv", "read": 14, "imported": 12, "quarantined": 2}]
    q = _quarantine(home, parts)
    assert q["reason"].to_list() == ["unparseable"] * 2
    assert sorted(q["raw"].to_list()) == [f"77,caf\\xe8,a,{_epoch(3, 5)},0", f"77,caf\\xe9,a,{_epoch(3)},1"]


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    _, _, _, table = _import(tmp_path, {"log.csv": b"\xef\xbb\xbf" + _csv(*_rows()).encode()})
    assert table.to_dicts() == [{"source_file": "log.csv", "read": 12, "imported": 12, "quarantined": 0}]


# --- 5. request ids


def test_files_of_one_stem_get_distinct_request_ids(tmp_path: Path) -> None:
    spec = {**SPEC, "files": {"all": ["log.*"]}}
    home, _, parts, table = _import(tmp_path, {"log.csv": _csv(*_rows()), "log.txt": _csv(*_rows()[:5])}, spec)
    assert table["imported"].to_list() == [12, 5]
    ids = pl.concat([p.events for p in parts.values()])["request_id"]
    assert ids.is_unique().all() and {"log.csv:2", "log.txt:2"} <= set(ids)


# --- 6. side tables


def test_side_table_keys_must_be_unique_and_missing_keys_are_counted(tmp_path: Path) -> None:
    spec = {**SPEC, "side_tables": [{"file": "items.csv", "joins": "item", "key": "i"}],
            "fields": {"advertiser_id": "pub", "bid": "dur"}}
    side = "i,pub,dur\n1,71,100\n2,72,200\n"
    with pytest.raises(ValueError, match=r"items\.csv: key column 'i' holds 1 value\(s\) on rows that differ, e\.g\. \['2'\]"):
        _import(tmp_path / "clash", {"log.csv": _csv(*_rows()), "items.csv": side + "2,79,5\n"}, spec)
    # an exact copy is dropped (counted); item 3 is not in the table: its rows counted, their fields null
    rows = [*_rows(), f"88,3,b,{_epoch(2, 30)},0"]
    _, result, parts, table = _import(tmp_path, {"log.csv": _csv(*rows), "items.csv": side + "1,71,100\n"}, spec)
    assert result.notes["side_tables"] == {"items.csv": {"rows": 2, "exact_copies_dropped": 1}}
    assert result.notes["side_key_missing"] == {"log.csv": 1}
    assert table.to_dicts() == [{"source_file": "log.csv", "read": 13, "imported": 12, "quarantined": 1}]  # missing_id


# --- 7. files that cannot be read name themselves


@pytest.mark.parametrize(("files", "spec", "bad"), [
    ({"log.csv.gz": gzip.compress(_csv(*_rows()).encode())[:60]}, {"files": {"all": ["log.csv.gz"]}}, "log.csv.gz"),
    ({"log.csv.gz": _csv(*_rows())}, {"files": {"all": ["log.csv.gz"]}}, "log.csv.gz"),
    ({"log.parquet": b"PAR1 not parquet"}, {"files": {"all": ["log.parquet"]}, "read": {"format": "parquet"}},
     "log.parquet"),
    ({"items.csv": "i,pub\n1,71\n2,72,EXTRA\n"}, {}, "items.csv"),
    ({"items.csv": b"i,pub\n1,7\xff\n"}, {}, "items.csv"),
    ({"items.csv": ""}, {}, "items.csv"),
])
def test_a_file_that_cannot_be_read_is_an_error_naming_it(tmp_path: Path, files: dict, spec: dict, bad: str) -> None:
    spec = {**SPEC, "side_tables": [{"file": "items.csv", "joins": "item", "key": "i"}], **spec}
    files = {"log.csv": _csv(*_rows()), "items.csv": "i,pub\n1,71\n", **files}
    with pytest.raises(ValueError, match=rf"src/{bad}: cannot read") as e:
        _import(tmp_path, files, spec)
    assert e.value.__cause__ is not None


# --- 8. specs refused at load


def test_a_spec_refuses_no_surfaces_and_an_offset_no_reader_takes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="surfaces"):
        _cfg(tmp_path, {**SPEC, "surfaces": {}})
    for where in ("/data/kuairand", "~/kuairand"):  # the repo's default is relative; a download is GEM_SOURCE_DIR
        with pytest.raises(ConfigError, match=r"default_dir.*relative to the repository"):
            _cfg(tmp_path, {**SPEC, "default_dir": where})
    for tz in ("+99:99", "+05:30"):
        with pytest.raises(ConfigError, match=r"time\.timezone"):
            _cfg(tmp_path, {**SPEC, "time": {**SPEC["time"], "timezone": tz}})
    assert _cfg(tmp_path, {**SPEC, "time": {**SPEC["time"], "timezone": "-05:00"}}).time.timezone == "-05:00"
