"""How much of day E is new? Impressions and clicks of E by the ad's age, per surface, with the oracle's NE.

    PYTHONPATH=. GEM_SIMULATOR=eval python bench/new_ads.py   # the world of `make eval`

The simulator's churn (assets/simulator*.yaml `churn`) renews a share of the ads every day. The age is
read from the logs as the reports read it (gem_model.eval.ad_age: the first day the ad_id appears in
the impressions of the calendar's window), so this needs every day of the window, but only the
impressions of each (day, surface) partition, simulated one partition at a time as ingest does (the
lake holds the same rows, less the corrupted records). Issue 24 asks >= 300 clicks on E, pooled over
surfaces, on the ads first seen on E in the evaluation world. Nothing is trained.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import load_calendar, load_simulator, load_surfaces  # noqa: E402
from gem_model.eval.ad_age import AGE_BUCKETS, ALL, ad_ages, ne_by_age  # noqa: E402
from gem_pipelines.data.simulator import simulate_day_frames  # noqa: E402


def window_impressions(cfg, surfaces, dates: list[dt.date]) -> pl.DataFrame:
    """request_id, date, surface, ad_id, click, p_click of every impression of `dates`."""
    cols = ["request_id", "date", "surface", "ad_id", "click", "p_click"]
    return pl.concat(
        [simulate_day_frames(cfg, surfaces, s, d)[0].select(cols) for d in dates for s in surfaces.names]
    )


def main() -> None:
    cfg, surfaces, calendar = load_simulator(), load_surfaces(), load_calendar()
    dates, e_day = calendar.dates(), calendar.roles().evaluation
    imps = window_impressions(cfg, surfaces, [d for d in dates if d <= e_day])
    ages = ad_ages(imps, e_day)
    rows = ne_by_age(imps.filter(pl.col("date") == e_day), ages)
    print(
        f"churn {cfg.churn.model_dump()}, {cfg.impressions_per_day} impressions/day; window {dates[0]}..{e_day}; "
        f"E = {e_day}, by the ad's first day in the window's impressions\n"
    )
    print("| surface | " + " | ".join(f"{b}: impressions / clicks / oracle NE" for b in AGE_BUCKETS) + " |")
    print("|---|" + "---|" * len(AGE_BUCKETS))
    for surface in [*surfaces.names, ALL]:
        cells = {r["ad_age"]: r for r in rows if r["surface"] == surface}
        print(
            f"| {surface} | "
            + " | ".join(
                f"{cells[b]['n']} / {cells[b]['positives']} / {cells[b]['ne']:.4f}" for b in AGE_BUCKETS
            )
            + " |"
        )
    new = next(r for r in rows if r["surface"] == ALL and r["ad_age"] == AGE_BUCKETS[0])
    print(
        f"\nclicks on E on ads first seen on E, pooled over surfaces: {new['positives']} "
        f"(issue 24 asks >= 300 in the evaluation world)"
    )


if __name__ == "__main__":
    main()
