"""Two foundation versions on the same day E, row for row: click NE per surface and by the ad's age
(gem_model.eval.ad_age), the oracle's NE on the same rows, and the paired 95% interval of the difference.
Nothing is trained: each version dir holds its predictions on E (eval_predictions.parquet, saved by
training), so the two must have been trained with the same calendar.

    GEM_SIMULATOR=eval GEM_HOME=<home with the lake> python bench/compare_versions.py --a <dir> [<dir> ...] --b <dir> [...]
        [--day D]

Prints a markdown table per pair (a seed of each), then, with several pairs, the mean +- sd over the pairs;
never pass/fail. `a` is the candidate, `b` the reference: diff = NE(a) - NE(b).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import load_calendar  # noqa: E402
from gem_model.eval.ad_age import AGE_BUCKETS, ALL, EVAL_PREDICTIONS, ad_ages, read_events  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, normalized_entropy, paired_difference, read_oracle  # noqa: E402


def compare(a_dir: str, b_dir: str, n_boot: int, day: dt.date | None = None) -> list[dict]:
    """Rows {surface, age, n, clicks, a, b, oracle, diff, lo, hi} of one pair, printed as a table (day: the
    day the predictions are of, default E)."""
    day = day or load_calendar().roles().evaluation
    cols = ["request_id", "surface", "click", "p_click"]
    pa, pb = (pl.read_parquet(Path(d) / EVAL_PREDICTIONS).select(cols) for d in (a_dir, b_dir))
    df = pa.join(pb.select("request_id", p_b="p_click"), on="request_id", how="inner")
    if df.height != pa.height or df.height != pb.height:
        raise SystemExit(f"the versions scored different rows ({pa.height} and {pb.height}, {df.height} shared)")
    df = df.join(ad_ages(read_events(day), day), on="request_id", how="left")
    oracle = read_oracle([day], missing_ok=True)
    if oracle is not None:
        df = df.join(oracle.select("request_id", p_o="p_click").unique("request_id"), on="request_id", how="left")
    print(f"\nday {day}; a = {Path(a_dir).name}, b = {Path(b_dir).name}; diff = NE(a) - NE(b), 95% paired interval\n")
    print("| surface | ad age | impressions | clicks | NE a | NE b | oracle NE | diff [95%] |\n|---|---|---|---|---|---|---|---|")
    out = []
    for surface in [*sorted(df["surface"].unique().to_list()), ALL]:
        for bucket in (ALL, *AGE_BUCKETS):
            s = df if surface == ALL else df.filter(pl.col("surface") == surface)
            s = s if bucket == ALL else s.filter(pl.col("ad_age") == bucket)
            y = s["click"].cast(pl.Float64).to_numpy()
            if not 0 < y.sum() < len(y):
                continue
            pred = {"a": s["p_click"].to_numpy(), "b": s["p_b"].to_numpy()}
            ne = {k: normalized_entropy(y, v) for k, v in pred.items()}
            boot = bootstrap_ne(y, pred, n_boot=n_boot)
            d = paired_difference(boot["a"], boot["b"], ne["a"] - ne["b"])
            o = normalized_entropy(y, s["p_o"].to_numpy()) if "p_o" in s.columns and s["p_o"].null_count() == 0 else np.nan
            out.append({"surface": surface, "age": bucket, "n": s.height, "clicks": int(y.sum()), "a": ne["a"],
                        "b": ne["b"], "oracle": o, "diff": d["diff"], "lo": d["lo"], "hi": d["hi"]})
            print(f"| {surface} | {bucket} | {s.height} | {int(y.sum())} | {ne['a']:.4f} | {ne['b']:.4f} | {o:.4f} | "
                  f"{d['diff']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", nargs="+", required=True, help="the candidate's version dirs, one a seed")
    p.add_argument("--b", nargs="+", required=True, help="the reference's version dirs, in the same seed order")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--day", type=dt.date.fromisoformat, default=None,
                   help="the day the predictions are of (default E; e.g. E-1 served by bench/serving_fold_in.py --save)")
    a = p.parse_args(argv)
    if len(a.a) != len(a.b):
        raise SystemExit("--a and --b need as many version dirs each (one pair a seed)")
    pairs = [compare(x, y, a.n_boot, a.day) for x, y in zip(a.a, a.b, strict=True)]
    if len(pairs) < 2:
        return 0
    print(f"\nMean +- sd over {len(pairs)} pairs; 'below 0': pairs whose interval of the difference lies below 0\n")
    print("| surface | ad age | NE a | NE b | oracle NE | gap closed a | gap closed b | diff | below 0 |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(pairs[0]):
        rows = [pair[i] for pair in pairs]
        v = {k: np.array([x[k] for x in rows]) for k in ("a", "b", "diff", "oracle")}
        closed = {k: (1 - v[k]) / (1 - v["oracle"]) for k in ("a", "b")}
        print(f"| {r['surface']} | {r['age']} | {v['a'].mean():.4f} +- {v['a'].std(ddof=1):.4f} | "
              f"{v['b'].mean():.4f} +- {v['b'].std(ddof=1):.4f} | {v['oracle'].mean():.4f} | "
              f"{closed['a'].mean():.0%} | {closed['b'].mean():.0%} | {v['diff'].mean():+.4f} +- {v['diff'].std(ddof=1):.4f} | "
              f"{sum(x['hi'] < 0 for x in rows)} of {len(rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
