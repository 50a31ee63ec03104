"""The foundation model against the models engineers already use, on the same rows of E, with power.

For each seed, every model's per-row click predictions on E (written by `train` and
`gem_model.eval.baselines`) are joined on request_id with the oracle's. Per surface, one Poisson
bootstrap over the rows (the same resamples for every model and seed: differences are paired)
gives the 95% interval of each model's seed-mean NE and of the difference foundation - other.
"better" is said only where that interval excludes 0. Calibration = mean prediction / click rate.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gem_model.config import load_calendar, load_surfaces
from gem_model.data.loader import date_range
from gem_model.eval.baselines import run_baselines
from gem_model.eval.metrics import (
    bootstrap_calibration,
    bootstrap_ne,
    interval,
    normalized_entropy,
    paired_difference,
    read_oracle,
)
from gem_model.store.paths import models_dir, storage_options, table_uri

PREDICTIONS = "eval_predictions.parquet"
MODELS = ("foundation", "single_surface", "logistic_regression", "base_rate")
N_BOOT = 1000


def run_lr_baselines(result: dict[str, Any], seeds: list[int]) -> list[dict[str, Any]]:
    """Base rate and logistic regression per seed, beside the foundation version; their rows."""
    roles = load_calendar().roles()
    days = [str(d) for d in date_range(*roles.teacher)]
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        out = Path(result["version_dir"]) / "baselines" / f"seed{seed}"
        res = run_baselines(days, str(roles.validation), str(roles.evaluation), out, uri=table_uri("training_examples"),
                            oracle_uri=table_uri("oracle"), seed=seed, storage_options=storage_options())
        for model in ("base_rate", "logistic_regression"):
            rows += [{"model": model, "seed": seed, **r} for r in res[model]]
    return rows


def _predictions(results: list[dict[str, Any]], seeds: list[int]) -> dict[tuple[str, int], pl.DataFrame]:
    """(model, seed) -> request_id, surface, click, p_click on E; one `run_foundation` result per seed."""
    out: dict[tuple[str, int], pl.DataFrame] = {}
    for result, seed in zip(results, seeds, strict=True):
        vdir = Path(result["version_dir"])
        out[("foundation", seed)] = pl.read_parquet(vdir / PREDICTIONS)
        single = [pl.read_parquet(models_dir("single_surface_baseline", s) / vdir.name / PREDICTIONS)
                  for s in load_surfaces().names]
        out[("single_surface", seed)] = pl.concat(single)
        for model in ("logistic_regression", "base_rate"):
            out[(model, seed)] = pl.read_parquet(vdir / "baselines" / f"seed{seed}" / model / PREDICTIONS)
    return out


def model_quality(results: list[dict[str, Any]], seeds: list[int], n_boot: int = N_BOOT) -> dict[str, Any]:
    preds = _predictions(results, seeds)
    roles = load_calendar().roles()
    oracle = read_oracle([roles.evaluation], uri=table_uri("oracle"), storage_options=storage_options())
    joined = preds[("foundation", seeds[0])].select("request_id", "surface", "click").join(
        oracle.select("request_id", pl.col("p_click").alias("oracle")), on="request_id", how="inner")
    for (model, seed), df in preds.items():
        # raw: before the post-hoc calibrator fitted on E-1 (models without one: their p_click)
        raw = pl.col("p_click_raw") if "p_click_raw" in df.columns else pl.col("p_click")
        joined = joined.join(df.select("request_id", pl.col("p_click").alias(f"{model}|{seed}"),
                                       raw.alias(f"{model}~{seed}")), on="request_id", how="inner")
    out: dict[str, Any] = {"surfaces": {}, "n_boot": n_boot, "seeds": seeds}
    valid_cal = oracle_calibration(roles.validation)
    for surface in sorted(joined["surface"].unique().to_list()):
        sub = joined.filter(pl.col("surface") == surface)
        cols = {c: sub[c].to_numpy() for c in sub.columns if "|" in c}
        raws = {c.replace("~", "|"): sub[c].to_numpy() for c in sub.columns if "~" in c}
        out["surfaces"][surface] = {
            **surface_quality(sub["click"].to_numpy().astype(np.float64), sub["oracle"].to_numpy(), cols, raws, seeds,
                              n_boot=n_boot),
            "oracle_calibration_valid": valid_cal.get(surface)}
    return out


def surface_quality(y: np.ndarray, truth: np.ndarray, cols: dict[str, np.ndarray], raws: dict[str, np.ndarray],
                    seeds: list[int], models: tuple[str, ...] = MODELS, n_boot: int = N_BOOT) -> dict[str, Any]:
    """One surface's table: y the clicks on E, truth the oracle's probabilities of the same rows,
    cols / raws {"<model>|<seed>": p_click} after / before the model's calibrator. The first of
    `models` is compared with the others."""
    boot = bootstrap_ne(y, {**cols, "oracle": truth}, n_boot=n_boot, seed=0)  # the oracle on the same resamples
    boot_cal = bootstrap_calibration(y, cols, n_boot=n_boot, seed=0)  # E's own click count moves it
    oracle_ne = normalized_entropy(y, truth)
    rows: dict[str, Any] = {}
    seed_mean: dict[str, np.ndarray] = {}
    point: dict[str, float] = {}
    for model in models:
        keys = [f"{model}|{s}" for s in seeds]
        nes = [normalized_entropy(y, cols[k]) for k in keys]
        cal = [float(np.mean(cols[k]) / np.mean(y)) for k in keys]
        cal_raw = [float(np.mean(raws[k]) / np.mean(y)) for k in keys]
        # against the true probabilities instead of E's clicks: E's own click count out of it
        cal_truth = [float(np.mean(cols[k]) / np.mean(truth)) for k in keys]
        ne_raw = [normalized_entropy(y, raws[k]) for k in keys]
        seed_mean[model] = np.mean([boot[k] for k in keys], axis=0)
        cal_lo, cal_hi = interval(np.mean([boot_cal[k] for k in keys], axis=0))
        point[model] = float(np.mean(nes))
        lo, hi = interval(seed_mean[model])
        gap_lo, gap_hi = interval((1 - seed_mean[model]) / (1 - boot["oracle"])) if oracle_ne < 1 else (None, None)
        rows[model] = {
            "ne": point[model], "ne_sd": float(np.std(nes, ddof=1)) if len(nes) > 1 else 0.0, "ne_lo": lo,
            "ne_hi": hi, "calibration": float(np.mean(cal)), "calibration_lo": cal_lo, "calibration_hi": cal_hi,
            "calibration_raw": float(np.mean(cal_raw)), "calibration_truth": float(np.mean(cal_truth)),
            "ne_raw": float(np.mean(ne_raw)),
            "gap_closed": (1 - point[model]) / (1 - oracle_ne) if oracle_ne < 1 else None,
            "gap_closed_lo": gap_lo, "gap_closed_hi": gap_hi,
        }
    first = models[0]
    diffs = {other: paired_difference(seed_mean[first], seed_mean[other], point[first] - point[other])
             for other in models[1:]}
    return {"n": int(len(y)), "positives": int(y.sum()), "oracle_ne": oracle_ne,
            # the simulator's true probabilities: how far E's realised clicks alone put a perfect model from 1.0
            "oracle_calibration": float(np.mean(truth) / np.mean(y)),
            "goal_ne": 1 - 0.6 * (1 - oracle_ne), "models": rows, "foundation_minus": diffs}


def oracle_calibration(day: dt.date) -> dict[str, float]:
    """Per surface: the oracle's calibration on `day` (sum of true click probabilities / clicks),
    i.e. how far that day's click count is from its expectation. On E-1 it is what a calibrator
    fitted there inherits (reporting only: no model reads the oracle)."""
    so = storage_options()
    clicks = (pl.scan_delta(table_uri("training_examples"), storage_options=so)
              .filter((pl.col("date") == day) & pl.col("click").is_not_null()).select("request_id", "click"))
    orc = read_oracle([day], uri=table_uri("oracle"), storage_options=so).lazy().select("request_id", "surface", "p_click")
    df = (orc.join(clicks, on="request_id").group_by("surface")
          .agg((pl.col("p_click").sum() / pl.col("click").sum()).alias("cal")).collect())
    return dict(zip(df["surface"].to_list(), df["cal"].to_list(), strict=True))


def quality_markdown(q: dict[str, Any], n_seeds: int, seconds: float) -> str:
    lines = [
        f"Click NE on E, mean +- sd over {n_seeds} seed(s), [95% bootstrap interval of the seed mean, "
        f"{q['n_boot']} resamples]; calibration = mean prediction / click rate, after the post-hoc map "
        "fitted on E-1, with the 95% bootstrap interval of the seed mean (raw: before the map; NE raw "
        "likewise; vs truth: mean prediction / mean true probability, i.e. without E's own click count; "
        "the oracle's: its true probabilities, i.e. how far E's click count alone puts a perfect model, and on E-1, where the map is fitted); "
        "gap = share of the base-rate-to-oracle gap closed (goal >= 60%), with the 95% interval of the same resamples "
        "(the oracle's NE resampled with the model's).",
        "",
        "| surface | positives | model | NE | 95% CI | NE raw | calibration | calibration raw | calibration vs truth | gap closed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, v in q["surfaces"].items():
        for m, r in v["models"].items():
            gap = f"{100 * r['gap_closed']:.0f}%" if r["gap_closed"] is not None else "-"
            if r.get("gap_closed_lo") is not None:
                gap += f" [{100 * r['gap_closed_lo']:.0f}%, {100 * r['gap_closed_hi']:.0f}%]"
            lines.append(f"| {s} | {v['positives']} | {m} | {r['ne']:.4f} +- {r['ne_sd']:.4f} | "
                         f"[{r['ne_lo']:.4f}, {r['ne_hi']:.4f}] | {r.get('ne_raw', r['ne']):.4f} | {r['calibration']:.3f} "
                         f"[{r.get('calibration_lo', math.nan):.3f}, {r.get('calibration_hi', math.nan):.3f}] | "
                         f"{r.get('calibration_raw', r['calibration']):.3f} | {r.get('calibration_truth', math.nan):.3f} | {gap} |")
        oc, ov = v.get("oracle_calibration"), v.get("oracle_calibration_valid")
        cal = ("" if oc is None else f"{oc:.3f}") + ("" if ov is None else f" (E-1: {ov:.3f})")
        lines.append(f"| {s} | {v['positives']} | oracle floor (goal NE <= {v['goal_ne']:.4f}) | {v['oracle_ne']:.4f} "
                     f"| | | {cal} | | 1.000 | 100% |")
    lines += ["", "Paired differences, NE(foundation) - NE(other), same resampled rows (negative: foundation "
              "better; a verdict only where the interval excludes 0):", "",
              "| surface | other model | difference | 95% CI | verdict |", "|---|---|---|---|---|"]
    for s, v in q["surfaces"].items():
        for other, d in v["foundation_minus"].items():
            verdict = {"a better": "foundation better", "b better": f"{other} better"}.get(d["verdict"], d["verdict"])
            lines.append(f"| {s} | {other} | {d['diff']:+.4f} | [{d['lo']:+.4f}, {d['hi']:+.4f}] | {verdict} |")
    lines += ["", f"Runtime: {seconds / 60:.1f} min."]
    return "\n".join(lines) + "\n"
