"""Serving-time fold-in: each day D scored as `teacher_predictions` scores it (predict_teacher with the
stale map re-fitted), without and with the ids born after the model's window folded in first
(gem_model.distill.serving_fold_in: the logs of the days between its window and D, no labels,
nothing of D itself). Prints click NE per surface and by the ad's age (gem_model.eval.ad_age), every
day's rows pooled, with paired 95% intervals of the difference, the share of the oracle gap closed and
the calibration against the truth (mean prediction / mean oracle probability). Nothing is trained.

    GEM_SIMULATOR=eval GEM_HOME=<a finished demo or week> python bench/serving_fold_in.py --days <D> [<D> ...]
        [--model <version dir>] [--serve-slices K] [--status-map platt|shift] [--relevel-surfaces yes|no]
        [--fold-lookback-days L] [--fit-fold-like-served yes|no] [--base-folded] [--save <dir>]

The model of each day is the foundation version that served it (its `teacher_predictions` rows), or
--model. Why: with churn most of E's impressions are of ads the teacher never saw (its window ends at
E-3), so their item rows and topic vectors are empty. Choose on E-1, report on E.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.distill.serving_fold_in import with_serving  # noqa: E402
from gem_model.distill.teacher import FOUNDATION, predict_teacher, read_teacher_predictions  # noqa: E402
from gem_model.eval.ad_age import AGE_BUCKETS, ALL, EVAL_PREDICTIONS, ad_ages, read_events  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy, read_oracle  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import models_dir, table_uri  # noqa: E402


def served_version(day: dt.date) -> str:
    versions = read_teacher_predictions([day], [FOUNDATION], embeddings=False)["teacher_version"].unique().to_list()
    if len(versions) != 1:
        raise SystemExit(f"{day}: {len(versions)} foundation versions in teacher_predictions; pass --model")
    return versions[0]


def yes_no(flag: str | None) -> bool | None:
    """A `yes|no` option as a bool (None: not given, the model's own)."""
    return None if flag is None else flag == "yes"


def score_day(day: dt.date, model_dir: Path | None, slices: int | None = None,
              base_folded: bool = False, status_map: str | None = None,
              relevel_surfaces: bool | None = None, fold_lookback_days: int | None = None,
              fit_fold_like_served: bool | None = None) -> tuple[pl.DataFrame, str]:
    """request_id, surface, click, base, folded, oracle_p, ad_age of `day`, and what was folded
    (slices, status_map, relevel_surfaces, fold_lookback_days, fit_fold_like_served: those `train.item_svd`
    options for the folded arm; None: the model's own; base_folded: the base arm folds with the model's own options instead of not at all)."""
    path = model_dir or models_dir("foundation_model") / served_version(day)
    model, own = load_model(path / "model.pt")
    options = {k: v for k, v in (("serve_slices", slices), ("status_map", status_map),
                                 ("relevel_surfaces", relevel_surfaces),
                                 ("fold_lookback_days", fold_lookback_days),
                                 ("fit_fold_like_served", fit_fold_like_served)) if v is not None}
    cfg = with_serving(own, **options)
    uri = table_uri("training_examples")
    base, folded = (predict_teacher(model, [day], FOUNDATION, path.name, uri=uri, recalibrate=True, fold_in=f)
                    .select("request_id", "surface", pl.col("p_click").alias(name))
                    for name, f in (("base", own if base_folded else None), ("folded", cfg)))
    clicks = (pl.scan_delta(uri).filter(pl.col("date") == day)
              .select("request_id", pl.col("click").cast(pl.Float64)).collect())
    df = base.join(folded.drop("surface"), on="request_id").join(clicks, on="request_id")
    oracle = read_oracle([day], uri=table_uri("oracle"), missing_ok=True)
    if oracle is not None:
        df = df.join(oracle.select("request_id", pl.col("p_click").alias("oracle_p")), on="request_id", how="left")
    df = df.join(ad_ages(read_events(day), day), on="request_id", how="left")
    return df, f"{day}: {path.name} (window ..{cfg['data']['train'][-1]})"


def surface_age_slices(df: pl.DataFrame, ages: tuple[str, ...]) -> Iterator[tuple[str, str, pl.DataFrame]]:
    """(surface, age, rows) of `df` per surface and then all surfaces, and per age in `ages` (ALL: every row);
    slices without a click are left out."""
    for surface in [*sorted(df["surface"].unique().to_list()), ALL]:
        s = df if surface == ALL else df.filter(pl.col("surface") == surface)
        for age in ages:
            b = s if age == ALL else s.filter(pl.col("ad_age") == age)
            if b.height and b["click"].sum():
                yield surface, age, b


def paired_stats(b: pl.DataFrame, a: str, ref: str, n_boot: int, others: tuple[str, ...] = (),
                 oracle: bool = True) -> dict:
    """On rows `b` (click, oracle_p and prediction columns): each column's NE, share of the oracle gap closed
    and calibration against the truth (nan without `oracle`), the oracle's NE, and the paired 95% interval
    (lo, hi) of NE(a) - NE(ref) over `n_boot` resamples of the rows."""
    y = b["click"].to_numpy().astype(np.float64)
    boot = bootstrap_ne(y, {k: b[k].to_numpy() for k in (a, ref)}, n_boot=n_boot, seed=0, chunk=10)
    lo, hi = interval(boot[a] - boot[ref])
    ne = {k: normalized_entropy(y, b[k].to_numpy()) for k in (a, ref, *others)}
    o = normalized_entropy(y, b["oracle_p"].to_numpy()) if oracle else float("nan")
    return {"ne": ne, "lo": lo, "hi": hi, "oracle_ne": o,
            "gap": {k: (1 - v) / (1 - o) if oracle else float("nan") for k, v in ne.items()},
            "cal": {k: float(b[k].mean() / b["oracle_p"].mean()) if oracle else float("nan") for k in ne}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", required=True, nargs="+", help="the days D to score (choose on E-1)")
    p.add_argument("--model", type=Path, default=None, help="a foundation version dir for every day")
    p.add_argument("--serve-slices", type=int, default=None,
                   help="train.item_svd.serve_slices of the folded arm (default: the model's own)")
    p.add_argument("--status-map", choices=["platt", "shift"], default=None,
                   help="train.item_svd.status_map of the folded arm (default: the model's own)")
    p.add_argument("--relevel-surfaces", choices=["yes", "no"], default=None,
                   help="train.item_svd.relevel_surfaces of the folded arm (default: the model's own)")
    p.add_argument("--fold-lookback-days", type=int, default=None,
                   help="train.item_svd.fold_lookback_days of the folded arm (default: the model's own)")
    p.add_argument("--fit-fold-like-served", choices=["yes", "no"], default=None,
                   help="train.item_svd.fit_fold_like_served of the folded arm (default: the model's own)")
    p.add_argument("--base-folded", action="store_true",
                   help="the base arm folds with the model's own options (compare serving options, not fold or none)")
    p.add_argument("--n-boot", type=int, default=500)
    p.add_argument("--save", type=Path, default=None,
                   help="write the folded predictions to SAVE/eval_predictions.parquet (p_click), the file "
                        "bench/compare_versions.py pairs: two models served on their own lakes, row for row")
    a = p.parse_args(argv)
    frames = []
    relevel, like = yes_no(a.relevel_surfaces), yes_no(a.fit_fold_like_served)
    for d in sorted({dt.date.fromisoformat(x) for x in a.days}):
        df, what = score_day(d, a.model, a.serve_slices, a.base_folded, a.status_map, relevel, a.fold_lookback_days,
                             like)
        frames.append(df)
        print(what)
    df = pl.concat(frames, how="diagonal")
    if a.save is not None:
        a.save.mkdir(parents=True, exist_ok=True)
        df.select("request_id", "surface", "click", pl.col("folded").alias("p_click")).write_parquet(
            a.save / EVAL_PREDICTIONS)
    oracle = "oracle_p" in df.columns and df["oracle_p"].null_count() == 0
    print(f"\nclick NE, {len(frames)} day(s) pooled: as served (base) and with the serving-time fold-in; "
          "diff = folded - base [95% CI]; gap = share of the oracle gap closed; cal = mean p / mean oracle p\n")
    print_paired(df, "folded", "base", a.n_boot, (*AGE_BUCKETS, ALL), oracle=oracle)
    return 0


def print_paired(df: pl.DataFrame, a: str, ref: str, n_boot: int, ages: tuple[str, ...], oracle: bool = True) -> None:
    """A markdown table per surface and ad age (`surface_age_slices`): NE of `ref` and `a`, the paired 95% interval
    of NE(a) - NE(ref), the oracle's NE, and each column's share of the oracle gap closed and calibration."""
    print(f"| surface | ad age | rows | clicks | NE {ref} | NE {a} | diff [95% CI] | oracle NE | gap {ref} | gap {a} "
          f"| cal {ref} | cal {a} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for surface, age, b in surface_age_slices(df, ages):
        r = paired_stats(b, a, ref, n_boot, oracle=oracle)
        ne, gap, cal = r["ne"], r["gap"], r["cal"]
        print(f"| {surface} | {age} | {b.height} | {int(b['click'].sum())} | {ne[ref]:.4f} | {ne[a]:.4f} | "
              f"{ne[a] - ne[ref]:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] | {r['oracle_ne']:.4f} | "
              f"{gap[ref]:.3f} | {gap[a]:.3f} | {cal[ref]:.3f} | {cal[a]:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
