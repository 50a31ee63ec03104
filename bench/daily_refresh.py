"""A daily refresh of a stale foundation against the serving-time fold-in: warm-start from a version and
train on the days that entered the teacher window since (gem_model.train.refresh, as foundation_refresh does),
then score day E as teacher_predictions does, the stale and the refreshed version each without and with the fold-in
(bench/serving_fold_in.py's score_day). Prints click NE per surface, on every row and on the ads first seen
on E, with the paired interval of refreshed - stale as served, the share of the oracle gap closed and the
calibration against the truth.

    GEM_SIMULATOR=eval GEM_HOME=<a finished week> python bench/daily_refresh.py --day <E> [<E+1> ...] \
        --init <version dir> --out-root <a scratch home> [--epochs 1] [--warm-lr-frac 0.1] [--catch-up]
        [--fold-lookback-days L] [--fit-fold-like-served yes|no]

The refreshed versions go under <out-root>/models/ (never the home's ACCEPTED). E's teacher window ends
at E-3 (assets/calendar.yaml's teacher_lag_days 1): the refresh trains on E-3 alone, selects on E-1;
--catch-up trains on every day after the init's window up to E-3 (what a chain of daily refreshes since the
init's retrain would have seen). Several days: the chain itself, each day refreshed from the day before's
refresh and compared with --init (the week's stale teacher), every day's rows pooled.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
import time
from pathlib import Path

import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.eval.ad_age import AGE_BUCKETS, ALL  # noqa: E402
from gem_model.train.refresh import calendar_for, refresh_foundation, trained_through  # noqa: E402

_spec = importlib.util.spec_from_file_location("serving_fold_in_bench", Path(__file__).with_name("serving_fold_in.py"))
serving_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving_bench)


def refresh(init: Path, day: dt.date, a: argparse.Namespace, catch_up: bool) -> Path:
    """Warm-start from `init` and train on E = `day`'s last teacher day E-3 (`catch_up`: every day after init's
    window up to E-3); the refreshed version's dir."""
    new_day = calendar_for(day).roles().teacher[1]
    first = trained_through(init) + dt.timedelta(days=1) if catch_up else new_day
    t0 = time.perf_counter()
    # the chain's root: --init, the stale version every day is compared with
    res = refresh_foundation(init, day, (first.isoformat(), new_day.isoformat()), root=a.init.name, epochs=a.epochs,
                             out_root=a.out_root, device="cpu", overrides={"train": {"warm_lr_frac": a.warm_lr_frac}})
    print(f"refreshed {init.name} on {first}..{new_day} -> {res['version']} (best step {res['best_step']}, "
          f"{time.perf_counter() - t0:.0f} s)")
    return Path(res["version_dir"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--day", required=True, nargs="+",
                   help="E, the day scored; several consecutive days: a chain, each day's refresh warm-started from "
                        "the one before (its first from --init), the stale version --init on every day")
    p.add_argument("--init", required=True, type=Path, help="the stale foundation version's dir")
    p.add_argument("--out-root", required=True, type=Path, help="where the refreshed version is written")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warm-lr-frac", type=float, default=0.1)
    p.add_argument("--catch-up", action="store_true", help="train from the day after the init's window to E-3")
    p.add_argument("--serve-slices", type=int, default=None, help="train.item_svd.serve_slices of both versions (default: their own)")
    p.add_argument("--fold-lookback-days", type=int, default=None,
                   help="train.item_svd.fold_lookback_days of both versions (default: their own)")
    p.add_argument("--fit-fold-like-served", choices=["yes", "no"], default=None,
                   help="train.item_svd.fit_fold_like_served of both versions (default: their own)")
    p.add_argument("--n-boot", type=int, default=500)
    a = p.parse_args(argv)
    days = sorted(dt.date.fromisoformat(d) for d in a.day)
    if any((b - c).days != 1 for c, b in zip(days, days[1:], strict=False)):
        raise SystemExit(f"--day: a chain is of consecutive days, got {[str(d) for d in days]}")
    like = serving_bench.yes_no(a.fit_fold_like_served)
    frames, init = [], a.init
    for day in days:
        # after the first, a refresh trains on the one day after the window of the one before
        init = refresh(init, day, a, catch_up=a.catch_up or day != days[0])
        served = {name: serving_bench.score_day(day, vdir, a.serve_slices, fold_lookback_days=a.fold_lookback_days,
                                                fit_fold_like_served=like)[0]
                  for name, vdir in (("stale", a.init), ("refreshed", init))}
        frames.append(served["stale"].select("request_id", "surface", "click", "oracle_p", "ad_age",
                                             pl.col("base").alias("stale_none"), pl.col("folded").alias("stale"))
                      .join(served["refreshed"].select("request_id", pl.col("base").alias("refreshed_none"),
                                                       pl.col("folded").alias("refreshed")), on="request_id"))
    df = pl.concat(frames)
    print(f"\nclick NE, {len(days)} day(s) pooled ({days[0]}..{days[-1]}); as served (the fold-in) unless `none`; "
          "diff = refreshed - stale [95% paired interval]; gap = share of the oracle gap closed; cal = mean p / mean "
          "oracle p\n")
    print("| surface | ad age | rows | clicks | NE stale | NE refreshed | diff [95%] | gap stale | gap refreshed | "
          "NE stale, none | NE refreshed, none | cal stale | cal refreshed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for surface, age, b in serving_bench.surface_age_slices(df, (AGE_BUCKETS[0], ALL)):  # new that day, every row
        r = serving_bench.paired_stats(b, "refreshed", "stale", a.n_boot, others=("stale_none", "refreshed_none"))
        ne, gap, cal, lo, hi = r["ne"], r["gap"], r["cal"], r["lo"], r["hi"]
        print(f"| {surface} | {age} | {b.height} | {int(b['click'].sum())} | {ne['stale']:.4f} | {ne['refreshed']:.4f} | "
              f"{ne['refreshed'] - ne['stale']:+.4f} [{lo:+.4f}, {hi:+.4f}] | {gap['stale']:.3f} | "
              f"{gap['refreshed']:.3f} | {ne['stale_none']:.4f} | {ne['refreshed_none']:.4f} | {cal['stale']:.3f} | "
              f"{cal['refreshed']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
