"""Point-in-time correctness of the jagged history join."""

from __future__ import annotations

import datetime as dt

import polars as pl

from gem_pipelines.data.formats import EVENTS_SCHEMA, HISTORY_COLUMNS
from gem_pipelines.data.history import attach_history, leakage_report

T0 = dt.datetime(2026, 11, 2, 12, 0, tzinfo=dt.UTC)


def events(rows: list[tuple[str, int, dt.datetime]]) -> pl.DataFrame:
    n = len(rows)
    base = {c: pl.Series([None] * n, dtype=t) for c, t in EVENTS_SCHEMA.items()}
    base["request_id"] = pl.Series([r[0] for r in rows])
    base["user_id"] = pl.Series([r[1] for r in rows], dtype=pl.Int64)
    base["ts"] = pl.Series([r[2] for r in rows], dtype=pl.Datetime("us", "UTC"))
    return pl.DataFrame(base)


def activity(rows: list[tuple[int, dt.datetime, int, str, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"user_id": pl.Int64, "ts": pl.Datetime("us", "UTC"), "item_id": pl.Int64,
                      "action": pl.String, "surface": pl.String}, orient="row",
    )


def test_history_is_strictly_before_oldest_first_truncated_and_cross_surface() -> None:
    s = dt.timedelta(seconds=1)
    act = activity([
        (1, T0 - 100 * s, 10, "view", "feed"),
        (1, T0 - 50 * s, 11, "like", "shops"),
        (1, T0 - 10 * s, 12, "click", "reels"),
        (1, T0, 13, "click", "feed"),           # same instant: not strictly before
        (1, T0 + 5 * s, 14, "view", "feed"),    # after: leakage if included
        (2, T0 - 1 * s, 20, "save", "marketplace"),
    ])
    ev = events([("a", 1, T0), ("b", 2, T0), ("c", 3, T0), ("d", 1, T0 + 6 * s)])
    out = attach_history(ev, act, max_len=3).sort("request_id")
    assert dict(out.schema) == {**EVENTS_SCHEMA, **HISTORY_COLUMNS}  # counters join later (test_counters)
    rows = {r["request_id"]: r for r in out.iter_rows(named=True)}
    assert rows["a"]["hist_item_id"] == [10, 11, 12]
    assert rows["a"]["hist_surface"] == ["feed", "shops", "reels"]
    assert rows["a"]["hist_seconds_before"] == [100.0, 50.0, 10.0]
    assert rows["b"]["hist_item_id"] == [20] and rows["b"]["hist_action"] == ["save"]
    assert rows["c"]["hist_item_id"] == [] and rows["c"]["hist_seconds_before"] == []  # empty, not null
    assert rows["d"]["hist_item_id"] == [12, 13, 14]  # the last 3, oldest first
    assert rows["d"]["hist_seconds_before"] == [16.0, 6.0, 1.0]
    report = leakage_report(out)
    assert report["not_before_impression"] == 0 and report["unordered_histories"] == 0
    assert report["null_histories"] == 0


def test_leakage_report_flags_future_and_disordered_values() -> None:
    bad = pl.DataFrame({"hist_seconds_before": [[5.0, 1.0], [1.0, 5.0], [0.0]]},
                       schema={"hist_seconds_before": pl.List(pl.Float64)})
    report = leakage_report(bad)
    assert report["not_before_impression"] == 1
    assert report["unordered_histories"] == 1
