"""MIND as Microsoft distributes it (behaviors.tsv + news.tsv, no header): the importer reads the
original layout unchanged. The shared samples hold only the CSV layout, so the files here are small
hand-made ones in the original layout (ids and categories as in MIND)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from gem_model.config import SOURCES_DIR, load_calendar
from gem_pipelines.sources.common import load_source
from tests.sources.helpers import account, normalize_all, run_import

NEWS = [  # news_id, category, subcategory, title, abstract, url, title entities, abstract entities
    ("N1", "news", "newsus", "t", "a", "https://x", "[]", "[]"),
    ("N2", "sports", "football_nfl", "t", "a", "https://x", "[]", "[]"),
    ("N3", "lifestyle", "lifestyleroyals", "t", "a", "https://x", "[]", "[]"),
    ("N4", "weather", "weathertopstories", "t", "a", "https://x", "[]", "[]"),
    ("N5", "sciencetech", "science", "t", "a", "https://x", "[]", "[]"),  # a category mind_full does not declare
    ("N6", "news", "broken line"),  # wrong field count: its news has no category
]
BEHAVIORS = [  # impression id, user, time, history, impressions
    ("1", "U10", "11/9/2019 8:55:22 AM", "N3 N4 N5", "N1-1 N2-0"),
    ("2", "U11", "11/10/2019 11:59:59 PM", "", "N2-1 N3-0 N4-0"),
    ("3", "U10", "11/14/2019 1:00:00 PM", "N3 N4 N5", "N1-0 N5-1"),  # N5: undeclared category
    ("4", "U12", "11/15/2019 6:30:00 AM", "N1", "N6-1 N2-2 Nx-0 N1-0"),  # N6, Nx: no category; a bad label
    ("5", "U12", "not a time", "", "N1-1"),
    ("6", "U13", "11/15/2019 7:00:00 AM", "N2"),  # a field short
]


def _write(path: Path, rows: list[tuple[str, ...]]) -> None:
    path.write_text("".join("\t".join(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, dict]:
    src = tmp_path_factory.mktemp("mind_full")
    _write(src / "behaviors_train.tsv", BEHAVIORS[:3])
    _write(src / "behaviors_dev.tsv", BEHAVIORS[3:])
    _write(src / "news_train.tsv", NEWS[:4])
    _write(src / "news_dev.tsv", NEWS)
    home = tmp_path_factory.mktemp("home")
    result = run_import("mind_full", home, src)
    return home, result, normalize_all("mind_full", home)


def test_every_candidate_is_imported_or_quarantined(imported) -> None:
    home, result, parts = imported
    # a row = one candidate of an impression line (a line that cannot be read at all: one row)
    assert result.files == {"behaviors_train.tsv": 2 + 3 + 2, "behaviors_dev.tsv": 4 + 1 + 1}
    table = account("mind_full", home, parts)
    assert dict(zip(table["source_file"], table["imported"], strict=True)) == {"behaviors_train.tsv": 6,
                                                                             "behaviors_dev.tsv": 1}
    assert (table["imported"] + table["quarantined"] == table["read"]).all(), table
    q = pl.concat([p.quarantine for p in parts.values()])
    # unknown_enum: N5 (undeclared category), N6 and Nx (no category); unparseable: the bad time, the short line
    assert sorted(q["reason"].to_list()) == ["bad_type"] + ["unknown_enum"] * 3 + ["unparseable"] * 2  # label 2


def test_days_follow_the_data_time_and_categories_are_surfaces(imported) -> None:
    _, _, parts = imported
    days = load_calendar(SOURCES_DIR / "mind_full" / "calendar.yaml").dates()
    events = pl.concat([p.events for p in parts.values()]).sort("ts", "request_id")
    assert events["request_id"].to_list() == [f"behaviors_train.tsv:{line}:{k}" for line, k in
                                              [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0)]] + ["behaviors_dev.tsv:1:3"]
    # Nov 9 -> the first day, Nov 14 -> E-1, Nov 15 -> E; the time of day is kept (23:59:59 -> :58)
    assert [t.date() for t in events["ts"]] == [days[0]] * 2 + [days[1]] * 3 + [days[5], days[6]]
    assert events["ts"][0].time() == dt.time(8, 55, 22) and events["ts"][2].time() == dt.time(23, 59, 58)
    assert events["surface"].to_list() == ["news", "sports", "sports", "lifestyle", "weather", "news", "news"]
    assert events["click"].to_list() == [1, 0, 1, 0, 0, 0, 0]
    assert events["user_id"].to_list() == [10, 10, 11, 11, 11, 10, 12]


def test_history_column_becomes_earlier_clicks(imported) -> None:
    _, result, parts = imported
    organic = pl.concat([p.organic for p in parts.values()])
    days = load_calendar(SOURCES_DIR / "mind_full" / "calendar.yaml").dates()
    # U10's N3 N4 once (N5's category is not declared: counted, not written), U12's N1 (line 4); line 5's
    # time is unreadable, so the line is quarantined whole and carries no history
    got = sorted(zip(organic["user_id"].to_list(), organic["item_id"].to_list(), strict=True))
    assert got == [(10, 3), (10, 4), (12, 1)]
    assert set(organic["action"]) == {"click"} and {t.date() for t in organic["ts"]} == {days[0]}
    assert result.notes == {"history_clicks_of_undeclared_categories": 1}


def test_mind_full_declares_the_original_layout() -> None:
    cfg = load_source("mind_full")
    assert cfg.files and all(n.endswith(".tsv") for names in cfg.files.values() for n in names) and cfg.news
