"""How strongly the data says the counters should shrink: a method-of-moments (empirical Bayes) estimate of
the prior strength per surface and id kind, from the logs of the teacher's window alone.

    GEM_HOME=<home> PYTHONPATH=. python bench/counter_strength.py [--days FIRST LAST]

For the ids (ads, users) of a surface with 2 or more impressions in the window, the impression-weighted
variance of their click rates is the variance of their true rates plus the binomial noise m(1-m)/n; what is
left over is the spread of the true rates, s^2, and a beta prior with that spread is worth
m(1-m)/s^2 - 1 pseudo-impressions: `counters.prior_strength` (features.yaml) is that number, shared by every
surface and kind. A guide to a search on E-1 (bench/MODEL_SEARCH.md 23), never a choice by itself: no label
of E-1 or E is read.
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

KINDS = {"ad": "ad_id", "user": "user_id"}


def moment_strengths(events: pl.DataFrame) -> pl.DataFrame:
    """surface, kind, ids, mean impressions, rate m, sd of the true rates s, strength m(1-m)/s^2 - 1 (null
    where the observed spread is all noise), from events (surface, ad_id, user_id, click)."""
    rows = []
    for kind, key in KINDS.items():
        per_id = (events.group_by("surface", key).agg(n=pl.len().cast(pl.Float64), k=pl.col("click").sum())
                  .filter(pl.col("n") >= 2).with_columns(r=pl.col("k") / pl.col("n")))
        stats = per_id.group_by("surface").agg(
            ids=pl.len(), mean_n=pl.col("n").mean(), m=pl.col("k").sum() / pl.col("n").sum(),
            r2=(pl.col("n") * pl.col("r") ** 2).sum() / pl.col("n").sum(),
            inv_n=pl.len() / pl.col("n").sum(),  # E[1/n] under impression weights: ids / impressions
        ).with_columns(vr=pl.col("r2") - pl.col("m") ** 2)  # the impression-weighted variance of the rates
        s2 = pl.col("vr") - pl.col("m") * (1 - pl.col("m")) * pl.col("inv_n")
        rows.append(stats.with_columns(kind=pl.lit(kind), s=s2.clip(0).sqrt(),
                                       strength=pl.when(s2 > 0).then(pl.col("m") * (1 - pl.col("m")) / s2 - 1)))
    return pl.concat(rows).select("surface", "kind", "ids", "mean_n", "m", "s", "strength").sort("kind", "surface")


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
