"""Is the foundation's calibration map stale between weekly retrains? For every day D of a lake that has
foundation predictions and an oracle (a simulated world after `make week`), compare the predictions as
served (behind the map fitted when the model was trained) with the same predictions behind a map
re-fitted on D-2 and D-1 (composed on the served one: a Platt map of a Platt map is a Platt map), under
the ACCEPTED foundation's rule (min_positives, shrinkage toward the pooled map). Per day and surface:
calibration against the truth (mean p / mean oracle p), NE, and the yardstick of day_report (the oracle's
own p behind a map fitted the same way on the same days): a cell is "ok" when the model is no further
from 1 than that yardstick.

    GEM_HOME=<home after make week> python bench/daily_recalibration.py [--first 2026-11-08] [--rules 300/none 300/10]

--raw scores every day with the ACCEPTED foundation itself, without its map (about half a minute a day
on 2 cores), so each rule is fitted on raw predictions as the pipeline fits it; "served" is then the
stored rule on those raw predictions. Without it the rules are fitted on the served predictions
(a map composed on the served map: quick, but the served map's own rule leaks into every variant).

--rules compares rules side by side, each SHRINK/LEVEL: the surface's own map against the pooled one
weighs positives / (positives + SHRINK), and the shift toward its own click rate positives /
(positives + LEVEL) (gem_model.models.calibration); LEVEL "none" is the blend alone.

Reads only days before D to map D; D's own labels score the result. The decision it records
(bench/RESULTS.md) was taken on a lake of `3a2ddbe`, whose teacher_predictions served the stored map;
since then they serve the re-fitted one (gem_model.models.calibration.refit_days), so on a newer lake
"served" already is the daily map.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

# bench/kernels.py would shadow the kernels package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.eval.metrics import normalized_entropy  # noqa: E402
from gem_model.models.calibration import fit_calibrator  # noqa: E402
from gem_model.models.registry import read_accepted  # noqa: E402
from gem_pipelines.day_report import scored  # noqa: E402
from gem_pipelines.metadata import md_grid  # noqa: E402


def _rule() -> dict:
    vdir = read_accepted("foundation_model")
    return json.loads((vdir / "metrics.json").read_text())["calibration"]


def remap(fit: pl.DataFrame, rows: pl.DataFrame, col: str, rule: dict) -> np.ndarray:
    """rows[col] behind a map fitted on fit[col] against fit's clicks, by the foundation's rule."""
    fit = fit.select("surface", "click", pl.col(col).alias("p_click")).with_columns(
        click_mask=pl.lit(True), conversion=pl.lit(0.0), conversion_mask=pl.lit(False), p_conversion=pl.lit(0.5))
    surfaces = sorted(rows["surface"].unique().to_list())
    cal = fit_calibrator(fit, surfaces, min_positives=int(rule["min_positives"]),
                         shrink_positives=float(rule.get("shrink_positives") or 0.0), prior=rule.get("prior") or "pooled",
                         level_positives=rule.get("level_positives"))
    return cal.apply_probs(rows[col].to_numpy(), rows["surface"].to_numpy())


def raw_scorer() -> Callable[[list[dt.date]], pl.DataFrame]:
    """scored()'s columns with p_click the ACCEPTED foundation's raw probability (no map); cached per day."""
    from gem_model.distill.teacher import predict_teacher
    from gem_model.models.registry import load_model
    from gem_model.store.paths import table_uri

    vdir = read_accepted("foundation_model")
    model, _ = load_model(vdir)
    model.calibrator = None
    cache: dict[dt.date, pl.DataFrame] = {}

    def score(days: list[dt.date]) -> pl.DataFrame:
        for d in days:
            if d not in cache:
                served = scored([d])
                raw = predict_teacher(model, [d], "foundation", vdir.name, uri=table_uri("training_examples"))
                cache[d] = served.drop("p_click").join(raw.select("request_id", "p_click"), on="request_id", how="inner")
        return pl.concat([cache[d] for d in days]) if days else scored([])
    return score


def day_rows(day: dt.date, rule: dict, score: Callable[[list[dt.date]], pl.DataFrame] = scored,
             stored: dict | None = None) -> list[list]:
    df, fit = score([day]), score([day - dt.timedelta(days=2), day - dt.timedelta(days=1)])
    if df.height == 0 or fit.height == 0 or df["oracle_p"].null_count() or fit["oracle_p"].null_count():
        return []
    df = df.with_columns(p_refit=remap(fit, df, "p_click", rule), oracle_refit=remap(fit, df, "oracle_p", rule))
    df = df.with_columns(p_raw=pl.col("p_click") if score is not scored else pl.lit(None, pl.Float64))
    if score is not scored:  # raw predictions: "served" is the stored rule fitted on them
        df = df.with_columns(p_click=remap(fit, df, "p_click", stored or rule))
    out = []
    for surface in sorted(df["surface"].unique().to_list()):
        s = df.filter(pl.col("surface") == surface)
        y, truth = s["click"].to_numpy(), s["oracle_p"].mean()
        cal = {c: (s[c].mean() or np.nan) / truth for c in ("p_click", "p_refit", "oracle_refit", "p_raw")}
        out.append([day.isoformat(), surface, int(y.sum()), cal["p_click"], cal["p_refit"], cal["oracle_refit"],
                    abs(cal["p_refit"] - 1) <= abs(cal["oracle_refit"] - 1),
                    normalized_entropy(y, s["p_click"].to_numpy()), normalized_entropy(y, s["p_refit"].to_numpy()),
                    cal["p_raw"]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", default="2026-11-08", help="the first day D to map (default: the demo week's)")
    parser.add_argument("--last", help="the last day D (default: the last with foundation predictions)")
    parser.add_argument("--raw", action="store_true", help="fit the rules on the foundation's raw predictions")
    parser.add_argument("--rules", nargs="*", default=[], help="SHRINK/LEVEL rules to compare (LEVEL 'none': the blend alone)")
    args = parser.parse_args()
    stored, first = _rule(), dt.date.fromisoformat(args.first)
    last = dt.date.fromisoformat(args.last) if args.last else first + dt.timedelta(days=30)
    variants = [stored] + [{**stored, "shrink_positives": float(r.split("/")[0]),
                            "level_positives": None if r.split("/")[1] == "none" else float(r.split("/")[1])}
                           for r in args.rules]
    score = raw_scorer() if args.raw else scored
    for rule in variants:
        report(rule, [r for i in range((last - first).days + 1)
                      for r in day_rows(first + dt.timedelta(days=i), rule, score, stored)])


def report(rule: dict, rows: list[list]) -> None:
    print(f"\n### rule: {rule.get('min_positives')} min positives, shrink {rule.get('shrink_positives')}, "
          f"prior {rule.get('prior')}, level {rule.get('level_positives')}\n")
    cols = ["day", "surface", "clicks", "calibration served", "calibration re-fitted on D-2, D-1",
            "oracle behind that map", "re-fitted ok", "NE served", "NE re-fitted", "calibration raw (--raw)"]
    print(md_grid(cols, rows, fmt=lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)).value)
    ne = np.array([[r[7], r[8]] for r in rows])
    print(f"\n{sum(r[6] for r in rows)} of {len(rows)} cells re-fitted no further from 1 than the oracle's yardstick; "
          f"mean |calibration - 1| served {np.mean([abs(r[3] - 1) for r in rows]):.4f}, "
          f"re-fitted {np.mean([abs(r[4] - 1) for r in rows]):.4f}; mean NE served {ne[:, 0].mean():.4f}, "
          f"re-fitted {ne[:, 1].mean():.4f}; mean |oracle yardstick - 1| "
          f"{np.mean([abs(r[5] - 1) for r in rows]):.4f}")


if __name__ == "__main__":
    main()
