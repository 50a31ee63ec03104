"""A warm-started retrain against a cold one on the same window, on the same rows of E (issue 24).

Per seed: an old model trained on an earlier window (what the ACCEPTED version was), then on the new
window a warm retrain from it (`train(init_from=old)`, which folds the window's new ids into the old
item basis, gem_model.train.item_svd) and a cold one (same seed, same config). Per surface, one
Poisson bootstrap over E's clickable rows (the same resamples for every model and seed: paired) gives
the interval of the seed-mean NE difference warm - cold ("warm no worse" when its upper end is <= 0
or the interval holds 0 with a point estimate <= `tolerance`). Pooled over surfaces too.

With `lr`, each seed also trains the logistic regression of gem_model.eval.baselines on the new window,
and the warm retrain (what production serves) is compared with it on E's impressions of ads first seen
on E (gem_model.eval.ad_age, the age read from `training_examples`): the cold-start case.
"""

from __future__ import annotations

import copy
import datetime as dt
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gem_model.eval.ad_age import ad_ages
from gem_model.eval.baselines import run_baselines
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy, paired_difference, read_oracle
from gem_model.store.paths import storage_options, table_uri

PREDICTIONS = "eval_predictions.parquet"  # written by gem_model.train.loop.train for data.eval


def warm_vs_cold(
    config: dict[str, Any],
    *,
    old_train: tuple[str, str],
    old_valid: str | None,
    new_train: tuple[str, str],
    new_valid: str | None,
    evaluation: str,
    seeds: list[int] | tuple[int, ...] = (0, 1, 2),
    out_root: str | Path,
    n_boot: int = 1000,
    tolerance: float = 0.005,
    oracle_uri: str | None = None,
    lr: bool = False,
    init_from: str | Path | None = None,
    warm_train: dict[str, Any] | None = None,
    reuse: str | Path | None = None,
    compare_only: bool = False,
) -> dict[str, Any]:
    """Train old, warm and cold per seed under `out_root`/s<seed>/ and compare warm with cold on
    `evaluation`. config: a `train()` config (preset, model, train, data.lake, device...); its data
    dates are replaced. oracle_uri: the oracle table, for the oracle's NE and the share of the gap
    closed (None: the lake's when `data.oracle` is on; skipped where there is none).
    Returns {"surfaces": {surface | "all": {n, positives, warm_ne, cold_ne, diff, lo, hi, verdict,
    warm_no_worse, oracle_ne, warm_gap_closed, cold_gap_closed}}, "seeds", "seconds": {...}, "runs": [...]},
    init_from: one trained old model for every seed (e.g. the ACCEPTED version, what production warm-starts
    from): no old training, old_train/old_valid unused. With `lr` also "new_ads": {surface | "all": {n, positives, warm_ne, warm_ci, lr_ne, lr_ci, diff, lo, hi, verdict}}.
    warm_train: `train` settings of the warm run alone (e.g. {"warm_lr_frac": 0.1}). reuse: a previous
    run's out_root whose old and cold models (same seeds, windows and config) are read instead of trained.
    compare_only: train nothing, compare the models already under `out_root`/s<seed>/ (seeds run apart,
    e.g. one a machine or a session, compared together; "runs" is then empty)."""
    from gem_model.train.loop import train

    out_root = Path(out_root)
    seconds = {"old": 0.0, "warm": 0.0, "cold": 0.0, **({"lr": 0.0} if lr else {})}
    lake = (config.get("data") or {}).get("lake")
    examples_uri = table_uri("training_examples", lake)
    preds: dict[str, pl.DataFrame] = {}
    runs = []
    for seed in seeds:
        base = out_root / f"s{seed}"
        for kind, window, valid, eval_day, init in (("old", old_train, old_valid, None, None),
                                                    ("warm", new_train, new_valid, evaluation, init_from or base / "old"),
                                                    ("cold", new_train, new_valid, evaluation, None)):
            if compare_only or (kind == "old" and init_from is not None):
                continue
            if reuse is not None and kind != "warm":
                if not (Path(reuse) / f"s{seed}" / kind).is_dir():
                    raise FileNotFoundError(f"reuse: no {kind} model of seed {seed} under {reuse}")
                continue
            t = time.perf_counter()
            cfg = {**copy.deepcopy(config), "seed": int(seed)}
            cfg["data"] = {**(cfg.get("data") or {}), "train": list(window), "valid": valid, "eval": eval_day}
            if kind == "warm":
                if reuse is not None and init_from is None:
                    init = Path(reuse) / f"s{seed}" / "old"
                cfg["train"] = {**(cfg.get("train") or {}), **(warm_train or {})}
            summary = train(cfg, out_dir=base / kind, init_from=init)
            seconds[kind] += time.perf_counter() - t
            if kind == "warm":
                runs.append({"seed": int(seed), "warm_start": summary["warm_start"]})
        if lr and not compare_only:
            t = time.perf_counter()
            days = pl.date_range(dt.date.fromisoformat(new_train[0]), dt.date.fromisoformat(new_train[1]), eager=True)
            run_baselines([str(d) for d in days], str(new_valid), evaluation, base / "lr", uri=examples_uri, seed=int(seed),
                          storage_options=storage_options(examples_uri))
            seconds["lr"] += time.perf_counter() - t
        cold_dir = Path(reuse) / f"s{seed}" / "cold" if reuse is not None else base / "cold"
        for kind, path in (("warm", base / "warm"), ("cold", cold_dir), ("lr", base / "lr" / "logistic_regression")):
            if kind != "lr" or lr:
                preds[f"{kind}|{seed}"] = pl.read_parquet(path / PREDICTIONS).select(
                    "request_id", "surface", "click", pl.col("p_click").alias(f"{kind}|{seed}"))
    first = f"warm|{seeds[0]}"
    joined = preds[first].select("request_id", "surface", "click", first)
    for k, df in preds.items():
        if k != first:
            joined = joined.join(df.select("request_id", k), on="request_id", how="inner")
    oracle = _oracle(config, evaluation, oracle_uri)
    if oracle is not None:
        joined = joined.join(oracle, on="request_id", how="left")
    out: dict[str, Any] = {"surfaces": {}, "seeds": [int(s) for s in seeds], "n_boot": n_boot, "tolerance": tolerance,
                           "evaluation": evaluation, "new_train": list(new_train), "old_train": list(old_train),
                           "seconds": seconds, "runs": runs}
    groups = [(s, joined.filter(pl.col("surface") == s)) for s in sorted(joined["surface"].unique().to_list())]
    for name, sub in [*groups, ("all", joined)]:
        out["surfaces"][name] = _compare(sub, list(seeds), n_boot, tolerance)
    if lr:
        events = pl.scan_delta(examples_uri, storage_options=storage_options(examples_uri)).select("request_id", "date", "ad_id")
        new = joined.join(ad_ages(events, dt.date.fromisoformat(evaluation)), on="request_id").filter(pl.col("ad_age") == "new")
        out["new_ads"] = {name: _versus_lr(sub, list(seeds), n_boot) for name, sub in
                          [*((s, new.filter(pl.col("surface") == s)) for s, _ in groups), ("all", new)]}
    return out


def _seed_means(y: np.ndarray, cols: dict[str, np.ndarray], seeds: list[int], kinds: tuple[str, str], n_boot: int,
                boot_seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
    """(every column's bootstrap NEs, each kind's seed-mean NE per resample, each kind's seed-mean NE)."""
    boot = bootstrap_ne(y, cols, n_boot=n_boot, seed=boot_seed)
    mean = {k: np.mean([boot[f"{k}|{s}"] for s in seeds], axis=0) for k in kinds}
    point = {k: float(np.mean([normalized_entropy(y, cols[f"{k}|{s}"]) for s in seeds])) for k in kinds}
    return boot, mean, point


def _versus_lr(sub: pl.DataFrame, seeds: list[int], n_boot: int) -> dict[str, Any]:
    """Seed-mean NE of the warm retrain and the LR on `sub`, each with its interval, and warm - LR paired."""
    y = sub["click"].to_numpy().astype(np.float64)
    if len(y) == 0 or y.sum() in (0, len(y)):
        return {"n": len(y), "positives": int(y.sum()), "warm_ne": None, "lr_ne": None}
    cols = {f"{k}|{s}": sub[f"{k}|{s}"].to_numpy() for k in ("warm", "lr") for s in seeds}
    _, mean, point = _seed_means(y, cols, seeds, ("warm", "lr"), n_boot, boot_seed=1)
    return {"n": len(y), "positives": int(y.sum()), "warm_ne": point["warm"], "warm_ci": list(interval(mean["warm"])),
            "lr_ne": point["lr"], "lr_ci": list(interval(mean["lr"])),
            **paired_difference(mean["warm"], mean["lr"], point["warm"] - point["lr"])}


def _oracle(config: dict[str, Any], day: str, uri: str | None) -> pl.DataFrame | None:
    if uri is None and not (config.get("data") or {}).get("oracle", True):
        return None
    lake = (config.get("data") or {}).get("lake")
    uri = uri or table_uri("oracle", lake)
    df = read_oracle([dt.date.fromisoformat(day)], uri=uri, storage_options=storage_options(uri), missing_ok=True)
    return None if df is None else df.select("request_id", pl.col("p_click").alias("oracle"))


def _compare(sub: pl.DataFrame, seeds: list[int], n_boot: int, tolerance: float) -> dict[str, Any]:
    y = sub["click"].to_numpy().astype(np.float64)
    cols = {c: sub[c].to_numpy() for c in sub.columns if "|" in c}
    has_oracle = "oracle" in sub.columns and sub["oracle"].null_count() == 0 and sub.height > 0
    if has_oracle:
        cols["oracle"] = sub["oracle"].to_numpy()
    boot, mean, point = _seed_means(y, cols, seeds, ("warm", "cold"), n_boot, boot_seed=0)
    diff = paired_difference(mean["warm"], mean["cold"], point["warm"] - point["cold"])
    row: dict[str, Any] = {"n": int(len(y)), "positives": int(y.sum()), "warm_ne": point["warm"], "cold_ne": point["cold"],
                           **diff, "warm_no_worse": bool(diff["hi"] <= 0 or (diff["lo"] <= 0 and diff["diff"] <= tolerance)),
                           "oracle_ne": None, "warm_gap_closed": None, "cold_gap_closed": None}
    if has_oracle:
        o = normalized_entropy(y, cols["oracle"])
        row["oracle_ne"] = o
        if o < 1:
            row["warm_gap_closed"] = (1 - point["warm"]) / (1 - o)
            row["cold_gap_closed"] = (1 - point["cold"]) / (1 - o)
            row["warm_gap_closed_ci"] = list(interval((1 - mean["warm"]) / (1 - boot["oracle"])))
    return row


def markdown(result: dict[str, Any]) -> str:
    """The comparison as a table."""
    lines = [f"warm vs cold retrain on {result['new_train'][0]}..{result['new_train'][1]}, evaluated on "
             f"{result['evaluation']} ({len(result['seeds'])} seeds, {result['n_boot']} paired bootstrap resamples)", "",
             "| surface | rows | clicks | warm NE | cold NE | warm - cold [95% CI] | warm no worse | gap closed warm / cold |",
             "|---|---|---|---|---|---|---|---|"]
    for s, r in result["surfaces"].items():
        gap = f"{r['warm_gap_closed']:.3f} / {r['cold_gap_closed']:.3f}" if r["warm_gap_closed"] is not None else "n/a"
        lines.append(f"| {s} | {r['n']} | {r['positives']} | {r['warm_ne']:.4f} | {r['cold_ne']:.4f} | "
                     f"{r['diff']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] | {'yes' if r['warm_no_worse'] else 'no'} | {gap} |")
    if "new_ads" in result:
        lines += ["", "Impressions of ads first seen on E: the warm retrain against the logistic regression "
                  "(seed-mean NE [95% CI]; warm - LR paired)", "",
                  "| surface | rows | clicks | warm NE | LR NE | warm - LR [95% CI] | verdict |", "|---|---|---|---|---|---|---|"]
        for s, r in result["new_ads"].items():
            if r["warm_ne"] is None:
                lines.append(f"| {s} | {r['n']} | {r['positives']} | n/a | n/a | n/a | no clicks to judge |")
                continue
            w, q = r["warm_ci"], r["lr_ci"]
            verdict = {"a better": "warm better", "b better": "LR better"}.get(r["verdict"], r["verdict"])
            lines.append(f"| {s} | {r['n']} | {r['positives']} | {r['warm_ne']:.4f} [{w[0]:.4f}, {w[1]:.4f}] | "
                         f"{r['lr_ne']:.4f} [{q[0]:.4f}, {q[1]:.4f}] | {r['diff']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] | {verdict} |")
    sec = result["seconds"]
    lines += ["", "train seconds (all seeds): " + ", ".join(f"{k} {v:.0f}" for k, v in sec.items())]
    return "\n".join(lines) + "\n"
