"""NE, AUC and calibration per surface and task, with the oracle's NE on the same rows.

NE (normalised entropy) = mean log loss / entropy of the empirical positive rate: 1.0 is the base
rate, lower is better, and the oracle's NE (the true probabilities of the simulator) is the floor.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.data.loader import TASKS, Batch, ExampleStream
from gem_model.models.calibration import apply as calibrated
from gem_model.store.paths import storage_options as env_storage_options
from gem_model.store.paths import table_uri

EPS = 1e-7
# Rows with fewer positives than this carry a 95% bootstrap interval of their NE (`ne_interval`): where a
# gate cannot judge a point estimate on so few clicks, the interval still says when a model is above the
# base rate on evidence. Above it the interval is narrow and costs a resampling of many rows.
FEW_POSITIVES = 1000
NE_INTERVAL_BOOT = 500


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(_row_log_loss(np.asarray(y, dtype=np.float64), p))) if len(y) else float("nan")


def entropy(rate: float) -> float:
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


def normalized_entropy(y: np.ndarray, p: np.ndarray) -> float:
    """Log loss over the entropy of the empirical rate (nan when all labels are equal)."""
    h = entropy(float(np.mean(y))) if len(y) else 0.0
    return log_loss(y, p) / h if h > 0 else float("nan")


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """Rank-based ROC AUC (Mann-Whitney U) with average ranks for ties; nan for one class only."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    n_pos = float(y.sum())
    n_neg = float(len(y) - n_pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = pl.Series(p).rank("average").to_numpy()  # 1-based, ties share their average rank
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibration(y: np.ndarray, p: np.ndarray) -> float:
    """Mean predicted / observed rate (1.0 is calibrated; nan without positives)."""
    obs = float(np.mean(y)) if len(y) else 0.0
    return float(np.mean(p)) / obs if obs > 0 else float("nan")


# ------------------------------------------------------------------------------------------------


def task_columns(y: np.ndarray, mask: np.ndarray, p: np.ndarray, raw: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`predict`'s per-task columns from [n, len(TASKS)] arrays (raw: before the model's calibrator)."""
    named = [("{}", y), ("{}_mask", mask.astype(bool)), ("p_{}", p.astype(np.float64))]
    named += [("p_{}_raw", raw.astype(np.float64))] if raw is not None else []
    return {name.format(t): v[:, j] for name, v in named for j, t in enumerate(TASKS)}


@torch.no_grad()
def predict(model: torch.nn.Module, loader: Iterable[Batch], *, device: torch.device | str | None = None,
            with_embeddings: bool = False, amp_dtype: torch.dtype | None = None) -> pl.DataFrame:
    """One pass: request_id, surface, labels, masks, p_click, p_conversion (+ embedding). A model
    carrying a calibrator (gem_model.models.calibration) gives calibrated p_* and its raw p_*_raw too."""
    was_training = model.training
    model.eval()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    core = getattr(model, "module", model)
    parts: dict[str, list[Any]] = {k: [] for k in ("request_id", "surface_idx", "y", "m", "p", "raw", "emb")}
    for batch in loader:
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            logits, h = core.forward_with_summary(batch)
        parts["request_id"].extend(batch.request_ids)
        parts["surface_idx"].append(batch.surface_idx.cpu().numpy())
        parts["y"].append(batch.labels.cpu().numpy())
        parts["m"].append((batch.label_mask & core.task_allowed[batch.surface_idx]).cpu().numpy())
        p, raw = calibrated(core, logits, batch.surface_idx)
        parts["p"].append(p.cpu().numpy())
        if raw is not None:
            parts["raw"].append(raw.cpu().numpy())
        if with_embeddings:
            parts["emb"].append(h.float().cpu().numpy())
    model.train(was_training)
    # an empty loader: (0, 2) zeros, so the columns below are empty (embeddings aside)
    cat = {k: np.concatenate(v) if v else np.zeros((0, 2)) for k, v in parts.items() if k != "request_id"}
    surfaces = list(core.cfg.surfaces)
    cols: dict[str, Any] = {
        "request_id": pl.Series(parts["request_id"], dtype=pl.String),
        "surface": pl.Series([surfaces[i] for i in cat["surface_idx"].astype(int).tolist()], dtype=pl.String),
        # a calibrated model: the raw probabilities too (reports show both)
        **task_columns(cat["y"], cat["m"], cat["p"], cat["raw"] if parts["raw"] else None),
    }
    if with_embeddings:
        emb = cat["emb"] if parts["emb"] else np.zeros((0, core.cfg.summary_dim), np.float32)
        cols["embedding"] = pl.Series(emb.astype(np.float32)).cast(pl.Array(pl.Float32, emb.shape[1]))
    return pl.DataFrame(cols)


def metric_rows(preds: pl.DataFrame, oracle_df: pl.DataFrame | None = None) -> list[dict[str, Any]]:
    """Rows {surface, task, ne, auc, calibration, calibration_raw, ne_raw, oracle_ne, gap, n, positives}
    from `predict` output (the *_raw pair: before the model's calibrator, None without one), and
    `ne_interval` (lo, hi) where positives are few (FEW_POSITIVES)."""
    if oracle_df is not None and len(oracle_df):
        orc = oracle_df.select("request_id", pl.col("p_click").alias("oracle_click"),
                               pl.col("p_conversion").alias("oracle_conversion")).unique("request_id", keep="first")
        preds = preds.join(orc, on="request_id", how="left")
    rows = []
    for surface in sorted(preds["surface"].unique().to_list()):
        sub = preds.filter(pl.col("surface") == surface)
        for task in TASKS:
            s = sub.filter(pl.col(f"{task}_mask"))
            if s.height == 0:
                continue
            y = s[task].to_numpy()
            p = s[f"p_{task}"].to_numpy()
            raw = s[f"p_{task}_raw"].to_numpy() if f"p_{task}_raw" in s.columns else None  # before the calibrator
            row: dict[str, Any] = {
                "surface": surface, "task": task, "ne": normalized_entropy(y, p), "auc": auc(y, p),
                "calibration": calibration(y, p), "calibration_raw": None if raw is None else calibration(y, raw),
                "ne_raw": None if raw is None else normalized_entropy(y, raw),
                "oracle_ne": None, "gap": None, "n": int(s.height), "positives": int(y.sum()),
            }
            if 0 < row["positives"] < FEW_POSITIVES:
                row["ne_interval"] = interval(bootstrap_ne(y, {"m": p}, n_boot=NE_INTERVAL_BOOT)["m"])
            col = f"oracle_{task}"
            if col in s.columns and s[col].null_count() == 0:  # the oracle's NE only on all the same rows
                row["oracle_ne"] = o_ne = normalized_entropy(y, s[col].to_numpy())
                if o_ne and math.isfinite(o_ne) and math.isfinite(row["ne"]):
                    row["gap"] = row["ne"] / o_ne - 1.0
            rows.append(row)
    return rows


def evaluate_day(model: torch.nn.Module, day: Any, surfaces: Iterable[str], *, uri: str | None = None,
                 oracle_uri: str | None = None, batch_size: int = 2048,
                 device: torch.device | str | None = None) -> list[dict[str, Any]]:
    """Metric rows of a GEM model on one day of `training_examples` (the gate's evaluation), with
    the oracle's NE when the lake has an oracle table."""
    surfaces = list(surfaces)
    oracle_df = read_oracle([day], surfaces, uri=oracle_uri, missing_ok=True)
    stream = ExampleStream(day, day, surfaces, batch_size=batch_size, shuffle=False, uri=uri,
                           max_len=getattr(getattr(model, "cfg", None), "seq_len", None))
    return metric_rows(predict(model, stream, device=device), oracle_df)


def read_oracle(
    dates: Iterable[Any], surfaces: Iterable[str] | None = None, *, uri: str | None = None,
    storage_options: dict[str, str] | None = None, missing_ok: bool = False,
) -> pl.DataFrame | None:
    """The oracle rows of some days (evaluation only; models never read this table). Real logs have
    no oracle table: with `missing_ok` that gives None (metrics without the floor); any other
    failure to read an existing table still raises."""
    from deltalake import DeltaTable

    uri = uri or table_uri("oracle")
    so = storage_options or env_storage_options()
    if missing_ok and not DeltaTable.is_deltatable(uri, storage_options=so):
        return None
    days = [d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)) for d in dates]
    lf = pl.scan_delta(uri, storage_options=so).filter(pl.col("date").is_in(days))
    if surfaces is not None:
        lf = lf.filter(pl.col("surface").is_in(list(surfaces)))
    return lf.select("request_id", "surface", "p_click", "p_conversion").collect()


def smaller_surfaces(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The rows (each with "positives") of every surface with positives but the one with the most: where one
    surface's clicks dominate a pooled score (KuaiRand's tab 1), what a model does on the others. None with
    fewer than three such surfaces (the "rest" would be one surface's own row)."""
    kept = [r for r in rows if r["positives"] > 0]
    if len(kept) < 3:
        return None
    largest = max(kept, key=lambda r: r["positives"])
    return [r for r in kept if r is not largest]


# ------------------------------------------------------------------------------------------------
# Bootstrap intervals (Poisson bootstrap over rows: every model of a comparison sees the same
# resampled rows, so differences are paired).


def _row_log_loss(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def _poisson_weights(n_rows: int, n_boot: int, seed: int, chunk: int):
    """Chunks of Poisson(1) row weights: the resamples every bootstrap of this module shares (a
    given seed gives the same resamples to NE and calibration, so they are paired too)."""
    rng = np.random.default_rng(seed)
    for start in range(0, n_boot, chunk):
        yield rng.poisson(1.0, size=(min(chunk, n_boot - start), n_rows)).astype(np.float64)


def bootstrap_ne(
    y: np.ndarray, preds: dict[str, np.ndarray], *, n_boot: int = 1000, seed: int = 0, chunk: int = 100
) -> dict[str, np.ndarray]:
    """NE of every model on `n_boot` Poisson-bootstrap resamples of the same rows: {name: [n_boot]}."""
    y = np.asarray(y, dtype=np.float64)
    ll = {k: _row_log_loss(y, p) for k, p in preds.items()}
    out: dict[str, list[np.ndarray]] = {k: [] for k in preds}
    for w in _poisson_weights(len(y), n_boot, seed, chunk):
        tot = w.sum(1)
        r = np.clip((w @ y) / tot, 1e-12, 1 - 1e-12)  # each resample's own positive rate
        h = -(r * np.log(r) + (1 - r) * np.log(1 - r))
        for k, v in ll.items():
            out[k].append((w @ v) / tot / h)
    return {k: np.concatenate(v) for k, v in out.items()}


def bootstrap_calibration(
    y: np.ndarray, preds: dict[str, np.ndarray], *, n_boot: int = 1000, seed: int = 0, chunk: int = 100
) -> dict[str, np.ndarray]:
    """Calibration (sum of predictions / sum of labels) of every model on the resamples of
    `bootstrap_ne` with the same seed: {name: [n_boot]}. How far the click count of E alone moves it."""
    y = np.asarray(y, dtype=np.float64)
    out: dict[str, list[np.ndarray]] = {k: [] for k in preds}
    for w in _poisson_weights(len(y), n_boot, seed, chunk):
        pos = np.maximum(w @ y, 1e-12)
        for k, p in preds.items():
            out[k].append((w @ np.asarray(p, dtype=np.float64)) / pos)
    return {k: np.concatenate(v) for k, v in out.items()}


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    return float(np.quantile(samples, a)), float(np.quantile(samples, 1 - a))


def paired_difference(a: np.ndarray, b: np.ndarray, point: float, level: float = 0.95) -> dict[str, Any]:
    """NE(a) - NE(b) with a bootstrap interval of the same resamples; `verdict` says "a better" /
    "b better" only when the interval excludes 0, else "no difference shown"."""
    lo, hi = interval(a - b, level)
    verdict = "a better" if hi < 0 else "b better" if lo > 0 else "no difference shown"
    return {"diff": point, "lo": lo, "hi": hi, "verdict": verdict}


def bootstrap_ci(
    y: np.ndarray, p: np.ndarray, *, n_boot: int = 200, seed: int = 0, level: float = 0.95
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals of NE, AUC and calibration (rows resampled with replacement).

    With no oracle (real logs) these intervals are what says whether two models differ."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    stats: dict[str, list[float]] = {"ne": [], "auc": [], "calibration": []}
    for _ in range(n_boot if len(y) else 0):
        i = rng.integers(0, len(y), len(y))
        for k, f in (("ne", normalized_entropy), ("auc", auc), ("calibration", calibration)):
            stats[k].append(f(y[i], p[i]))
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    finite = {k: np.asarray([x for x in v if math.isfinite(x)]) for k, v in stats.items()}
    return {k: (float(np.percentile(a, lo)), float(np.percentile(a, hi))) if len(a) else (float("nan"), float("nan"))
            for k, a in finite.items()}
