"""How strongly the data says the counters should shrink: a method-of-moments (empirical Bayes) estimate of
the prior strength per surface and id kind, from the logs of the teacher's window alone.

    GEM_HOME=<home> PYTHONPATH=. python bench/counter_strength.py [--days FIRST LAST]

The estimate is gem_pipelines.data.counters.moment_strengths (the spread of the ids' click rates beyond their
binomial noise, as a beta prior's pseudo-impressions), over the window's ids of 2 or more impressions on a
surface. `counters.prior_strength` (features.yaml) is one number for every surface and kind; with
`counters.moments` the counters estimate it per surface and kind from their own earlier days. A guide to a
search on E-1 (bench/MODEL_SEARCH.md 23), never a choice by itself: no label of E-1 or E is read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]  # bench/kernels.py would shadow the package
sys.path.insert(0, str(_HERE.parent))

import polars as pl  # noqa: E402

from gem_model.config import load_calendar  # noqa: E402
from gem_model.store.paths import storage_options, table_uri  # noqa: E402
from gem_pipelines.data.counters import moment_strengths  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", nargs=2, default=None, metavar=("FIRST", "LAST"),
                   help="window (default: the calendar's teacher window)")
    a = p.parse_args(argv)
    first, last = (dt.date.fromisoformat(d) for d in a.days) if a.days else load_calendar().roles().teacher
    events = (pl.scan_delta(table_uri("events"), storage_options=storage_options())
              .filter(pl.col("date").is_between(first, last))
              .select("surface", "ad_id", "user_id", pl.col("click").fill_null(0).cast(pl.Float64)).collect())
    print(f"events {first}..{last}: {events.height:,} impressions\n")
    print("| surface | kind | ids (>= 2 impressions) | mean impressions | click rate | sd of true rates | strength |")
    print("|---|---|---|---|---|---|---|")
    for r in moment_strengths(events).iter_rows(named=True):
        strength = "spread is noise" if r["strength"] is None else f"{r['strength']:.0f}"
        print(f"| {r['surface']} | {r['kind']} | {r['ids']:,} | {r['mean_n']:.1f} | {r['m']:.4f} | {r['s']:.4f} | {strength} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
