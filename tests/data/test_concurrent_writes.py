"""One writer per Delta partition: concurrent ingests of one partition leave one consistent table."""

from __future__ import annotations

import datetime as dt
import fcntl
import threading
from pathlib import Path

import polars as pl
import pytest

from gem_model.store import delta
from gem_model.store.paths import table_uri
from gem_pipelines.data import lake
from gem_pipelines.data.concurrency import TABLES, concurrent_ingest, land

D = dt.date(2026, 11, 2)


def test_a_lake_of_an_older_schema_is_refused_with_what_it_lacks(gem_home: Path) -> None:
    """A version that adds a column (a new counter) meets a lake written before it: the write names the
    columns and says how to rebuild, and the table keeps its rows."""
    uri = str(gem_home / "lake" / "t")
    old = pl.DataFrame({"date": [D], "x": [1.0]})
    delta.overwrite_partition(old, uri, partition_by=["date"], lock_keys=["t"], predicate=f"date = '{D}'")
    new = pl.DataFrame({"date": [D + dt.timedelta(days=1)], "x": [2.0], "ad_other_impressions_before": [3.0]})
    with pytest.raises(ValueError, match=r"lacks \['ad_other_impressions_before'\].*re-materialize every partition"):
        delta.overwrite_partition(new, uri, partition_by=["date"], lock_keys=["t"],
                                  predicate=f"date = '{D + dt.timedelta(days=1)}'")
    assert pl.read_delta(uri).equals(old)


@pytest.mark.timeout(300)
def test_two_processes_ingesting_one_partition(gem_home: Path) -> None:
    land(gem_home, "feed", D)
    for attempt in range(3):
        report = concurrent_ingest(gem_home, "feed", D)
        c = report["conservation"]
        assert report["duplicate_rows"] == 0, report
        assert c["missing"] == 0 and c["impressions"] == report["rows"] > 0, report
        for table in TABLES:
            mine = sorted(v[table] for v in report["versions"])
            # each writer got its own commit's version, and the table history holds exactly those
            assert mine[0] != mine[1], report
            assert report["committed"][table] == list(range(2 * (attempt + 1))), report
            assert set(mine) <= set(report["committed"][table])


def test_version_is_the_writers_own_commit(gem_home: Path) -> None:
    """A write that lands after ours does not change the version we report."""
    schema = {"date": pl.Date, "surface": pl.String, "x": pl.Int64}
    root = str(gem_home / "lake")

    def frame(surface: str) -> pl.DataFrame:
        return pl.DataFrame({"date": [D], "surface": [surface], "x": [1]}, schema=schema)

    versions: dict[str, int] = {}
    for surface in ("feed", "reels", "feed"):
        versions[surface] = lake.write_partition(frame(surface), "oracle", {"date": D, "surface": surface},
                                                 schema, root=root)
    assert versions == {"feed": 2, "reels": 1}
    assert lake.table_version("oracle", root=root) == 2


def test_maintenance_and_writers_exclude_each_other(gem_home: Path) -> None:
    """A partition writer holds the table lock shared: OPTIMIZE/VACUUM (exclusive) waits for it,
    writers of other partitions do not; while maintenance holds the table, writers wait."""
    uri = table_uri("events", str(gem_home / "lake"))
    lock_file = delta._lock_dir(uri) / "table.lock"

    def table_lock_free() -> bool:
        with open(lock_file, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True

    def writer(key: str, done: threading.Event) -> threading.Thread:
        def run() -> None:
            with delta.partition_lock(uri, key):
                done.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    with delta.partition_lock(uri, "date=2026-11-02__surface=feed"):
        assert not table_lock_free()
        other = threading.Event()
        writer("date=2026-11-02__surface=reels", other).join(timeout=30)
        assert other.is_set()
        same = threading.Event()
        t_same = writer("date=2026-11-02__surface=feed", same)
        assert not same.wait(0.5)  # the same partition waits for us
    t_same.join(timeout=30)
    assert same.is_set() and table_lock_free()
    with delta.table_lock(uri):
        blocked = threading.Event()
        t = writer("date=2026-11-03__surface=feed", blocked)
        assert not blocked.wait(0.5)
    t.join(timeout=30)
    assert blocked.is_set()


def test_optimize_and_vacuum_waits_for_a_writer_and_keeps_the_rows(gem_home: Path) -> None:
    schema = {"date": pl.Date, "surface": pl.String, "x": pl.Int64}
    root = str(gem_home / "lake")
    for surface in ("feed", "reels", "feed"):
        lake.write_partition(pl.DataFrame({"date": [D], "surface": [surface], "x": [1]}, schema=schema), "oracle",
                             {"date": D, "surface": surface}, schema, root=root)
    before = lake.scan("oracle", root=root).collect().sort("surface")
    done = threading.Event()
    result: dict = {}
    with delta.partition_lock(table_uri("oracle", root), "date=2026-11-02__surface=feed"):
        t = threading.Thread(target=lambda: (result.update(lake.optimize_and_vacuum("oracle", root=root)), done.set()),
                             daemon=True)
        t.start()
        assert not done.wait(0.5)  # maintenance does not run under a writer
    t.join(timeout=60)
    assert done.is_set() and result["version"] == lake.table_version("oracle", root=root)
    assert lake.scan("oracle", root=root).collect().sort("surface").equals(before)
