"""KuaiRand's spec on the shared sample: every row imported or quarantined (other tabs unknown_enum,
later exact copies duplicate_record), times outside their `date` clamped and counted, the window
the data's days. Expectations are recomputed from the raw file with polars."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from gem_pipelines.sources.common import load_source
from tests.sources.helpers import account, dataset_calendar, need, normalize_all, run_import

LOG = "log_standard_pure_20220425_20220503.csv.gz"
TABS = {"1": "tab_1", "0": "tab_0", "4": "tab_4", "6": "tab_6", "2": "tab_2"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("kuairand")
    result = run_import("kuairand", home)
    return home, result, normalize_all("kuairand", home)


@pytest.fixture(scope="module")
def raw() -> pl.DataFrame:
    return pl.read_csv(need("kuairand_pure") / LOG, infer_schema=False).with_row_index("i")


def test_spec_declares_tab_1_first_and_never_reads_random_logs(tmp_path: Path) -> None:
    cfg = load_source("kuairand")
    assert list(cfg.surfaces.values())[0] == "tab_1" and cfg.surfaces == TABS
    from gem_pipelines.sources.common import source_files

    for name in (LOG, "log_standard_4_08_to_4_21_pure.csv", "log_random_4_22_to_5_08_pure.csv",
                 "log_random_pure_20220425_20220503.csv.gz"):
        (tmp_path / name).write_text("x\n")
    assert sorted(p.name for _, p in source_files(cfg, tmp_path)) == [
        "log_standard_4_08_to_4_21_pure.csv", LOG]


def test_every_row_is_imported_or_quarantined(imported, raw: pl.DataFrame) -> None:
    home, result, parts = imported
    table = account("kuairand", home, parts).row(0, named=True)
    assert table["source_file"] == LOG and table["read"] == raw.height == result.files[LOG]
    assert table["imported"] + table["quarantined"] == table["read"]

    mapped = raw.filter(pl.col("tab").is_in(list(TABS)))
    line = pl.concat_str(pl.exclude("i"), separator=",")
    later_copy = line.is_duplicated() & ~line.is_first_distinct()  # an exact copy of an earlier line
    copies = mapped.filter(later_copy).height
    assert copies > 3000  # the sample's known quirk (3,806 in tab 6 alone)
    q = pl.concat([p.quarantine for p in parts.values()])
    reasons = dict(q.group_by("reason").len().iter_rows())
    assert reasons == {"unknown_enum": raw.height - mapped.height, "duplicate_record": copies}
    assert table["imported"] == mapped.height - copies and result.notes["exact_duplicates"] == {LOG: copies}
    # the other tabs land in tab 1's partitions (a small tab's quarantine rate stays its own)
    assert set(q.filter(pl.col("reason") == "unknown_enum")["surface"]) == {"tab_1"}


def test_the_day_is_the_date_column_and_times_are_clamped_into_it(imported, raw: pl.DataFrame) -> None:
    home, result, parts = imported
    cal = dataset_calendar("kuairand", home)
    assert (cal.start, cal.end(), cal.roles().validation) == (dt.date(2022, 4, 25), dt.date(2022, 5, 3),
                                                               dt.date(2022, 5, 2))
    local = pl.from_epoch(pl.col("time_ms").cast(pl.Int64), time_unit="ms").dt.replace_time_zone("UTC")\
        .dt.convert_time_zone("Asia/Shanghai").dt.date()
    day = pl.col("date").str.strptime(pl.Date, "%Y%m%d")
    outside = raw.filter(pl.col("tab").is_in(list(TABS)) & (local != day)).height
    assert outside > 1000 and result.notes["time_clamped"] == {LOG: outside}
    events = pl.concat([p.events for p in parts.values()])
    # every event on its `date`, ids from the log, the author from the video side table
    ev = events.with_columns(line=pl.col("request_id").str.extract(r":(\d+)$").cast(pl.UInt32) - 2)
    ev = ev.join(raw.select("i", "date", "video_id", "is_click", "long_view"), left_on="line", right_on="i")
    assert (ev["date"].dt.strftime("%Y%m%d") == ev["date_right"]).all()
    assert (ev["ad_id"].cast(pl.String) == ev["video_id"]).all()
    assert (ev["click"].cast(pl.String) == ev["is_click"]).all() and (ev["conversion"].cast(pl.String) == ev["long_view"]).all()
    videos = pl.read_csv(need("kuairand_pure") / "video_features_basic_pure.csv", infer_schema=False)
    authors = ev.select(video_id="video_id", advertiser_id=pl.col("advertiser_id").cast(pl.String)).unique()
    assert authors.join(videos, on="video_id").filter(pl.col("advertiser_id") != pl.col("author_id")).is_empty()
    # the video's duration (ms) in the dense `bid` slot, the constant 0 where the side table has none
    dur = ev.join(videos.select("video_id", "video_duration"), on="video_id", how="left")
    expected = dur["video_duration"].cast(pl.Float64, strict=False).fill_null(0.0)
    assert (expected > 0).mean() > 0.9 and (dur["bid"] == expected).all()
