"""The models engineers already use, on the foundation model's rows and split: base rate and a
logistic regression on hand-built features.

Base rate: each surface's click rate over the training window.

Logistic regression: hashed one-hot features (a weight per value, an EmbeddingBag of width 1) plus
a few dense ones:
  surface; ad, ad x surface; advertiser; objective; creative format; device; user;
  position x surface; hour; the history items (1/sqrt(len) each: the user's interests) and the
  history-item x candidate-ad crosses (1/sqrt(len) each: does this user's history go with this
  ad, learned pair by pair); log1p(#times the ad is in the history), log1p(history length) and
  the standardised dense features.
Trained with Adagrad for up to `epochs` epochs; the epoch with the best click NE on the validation
day (E-1) is kept, then a post-hoc map is fitted as the foundation's is (gem_model.models.calibration: the days
after the window up to E-1). Evaluated on E like every other model (`metric_rows`), with per-row predictions
written for the paired bootstrap.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from gem_model.config import FeaturesConfig, SurfacesConfig, load_features, load_surfaces
from gem_model.data.loader import Batch, ExampleStream
from gem_model.data.normalization import dense_stats
from gem_model.eval.metrics import metric_rows, read_oracle
from gem_model.models.calibration import DEFAULT_CALIBRATION, calibration_days, fit_model_calibrator

HASH_BITS = 20
_P1, _P2, _P3 = 1_000_003, 998_244_353, 1_000_000_007


def _h(field: int, a: torch.Tensor, b: torch.Tensor | int = 0) -> torch.Tensor:
    """Deterministic hash of (field, a, b) into [0, 2^HASH_BITS)."""
    x = (a.long() * _P1 + (b.long() if isinstance(b, torch.Tensor) else b) * _P2 + field * _P3) & 0x7FFFFFFFFFFF
    x = x ^ (x >> 17)
    return torch.remainder(x * 0x9E3779B1, 1 << HASH_BITS)


class HashedLR(nn.Module):
    def __init__(self, n_dense: int):
        super().__init__()
        self.w = nn.EmbeddingBag(1 << HASH_BITS, 1, mode="sum")
        nn.init.zeros_(self.w.weight)
        self.dense = nn.Linear(n_dense, 1)
        nn.init.zeros_(self.dense.weight)
        nn.init.constant_(self.dense.bias, -3.5)

    def forward(self, idx: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return (self.w(idx, offsets, per_sample_weights=weights) + self.dense(dense)).squeeze(-1)


class LRFeatures:
    """Batch -> (indices, bag offsets, weights, dense) of the hashed logistic regression."""

    def __init__(self, features: FeaturesConfig, mean: Sequence[float], std: Sequence[float]):
        self.col = {f.name: i for i, f in enumerate(features.sparse)}
        self.dense_names = [f.name for f in features.dense]
        self.mean = torch.tensor(mean, dtype=torch.float32)
        self.std = torch.tensor(std, dtype=torch.float32)
        self.hist_col = next((c.name for c in features.history.columns if c.source == "item_id"), None)

    @property
    def n_dense(self) -> int:
        return len(self.dense_names) + 2

    def __call__(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        n = len(b)
        sp = b.sparse
        c = self.col
        surf = b.surface_idx
        ad = sp[:, c["ad_id"]]
        pos = torch.expm1(b.dense[:, self.dense_names.index("position")]).round().long()
        hour = b.dense[:, self.dense_names.index("hour_of_day")].round().long()
        per_row = [
            _h(1, surf), _h(2, ad), _h(3, ad, surf), _h(4, sp[:, c["advertiser_id"]]), _h(5, sp[:, c["objective"]]),
            _h(6, sp[:, c["creative_format"]]), _h(7, sp[:, c["device"]]), _h(8, sp[:, c["user_id"]]),
            _h(9, pos, surf), _h(10, hour),
        ]
        fixed = torch.stack(per_row, 1)  # [B, F]
        lengths = (b.offsets[1:] - b.offsets[:-1]).long()
        match = torch.zeros(n)
        if self.hist_col is not None and int(lengths.sum()):
            items = b.history[self.hist_col].long()
            seg = torch.repeat_interleave(torch.arange(n), lengths)
            hw = (1.0 / lengths.clamp_min(1).float().sqrt())[seg]
            h_idx = torch.stack([_h(11, items), _h(12, items, ad[seg])], 1)  # [L, 2]
            match = torch.zeros(n).index_add(0, seg, (items == ad[seg]).float())
            # per row: F fixed features, then 2 per history entry
            counts = fixed.shape[1] + 2 * lengths
            order = torch.argsort(torch.cat([torch.arange(n).repeat_interleave(fixed.shape[1]), seg.repeat_interleave(2)]),
                                  stable=True)
            idx = torch.cat([fixed.reshape(-1), h_idx.reshape(-1)])[order]
            w = torch.cat([torch.ones(fixed.numel()), hw.repeat_interleave(2)])[order]
        else:
            counts = torch.full((n,), fixed.shape[1])
            idx, w = fixed.reshape(-1), torch.ones(fixed.numel())
        offsets = torch.zeros(n, dtype=torch.long)
        offsets[1:] = torch.cumsum(counts, 0)[:-1]
        dense = torch.cat([(b.dense.float() - self.mean) / self.std,
                           torch.log1p(match)[:, None], torch.log1p(lengths.float())[:, None]], 1)
        return idx, offsets, w, dense


@torch.no_grad()
def _predict(stream: ExampleStream, surfaces: list[str], score: Callable[[Batch], np.ndarray]) -> pl.DataFrame:
    """Every row of `stream` in the `metrics.predict` layout, p_click = score(batch) (click task only)."""
    parts: dict[str, list[Any]] = {"request_id": [], "surface": [], "click": [], "click_mask": [], "p_click": []}
    for b in stream:
        parts["request_id"] += b.request_ids
        parts["surface"] += [surfaces[i] for i in b.surface_idx.tolist()]
        parts["click"].append(b.labels[:, 0].numpy())
        parts["click_mask"].append(b.label_mask[:, 0].numpy())
        parts["p_click"].append(score(b))
    cat = {k: (np.concatenate(v) if k in ("click", "click_mask", "p_click") else v) for k, v in parts.items()}
    n = len(cat["request_id"])
    return pl.DataFrame({
        **cat, "conversion": np.zeros(n), "conversion_mask": np.zeros(n, bool), "p_conversion": np.zeros(n),
    })


def _lr_score(model: HashedLR, feats: LRFeatures) -> Callable[[Batch], np.ndarray]:
    return lambda b: torch.sigmoid(model(*feats(b))).numpy().astype(np.float64)


def _click_ne(preds: pl.DataFrame) -> float:
    rows = [r for r in metric_rows(preds) if r["task"] == "click" and math.isfinite(r["ne"])]
    tot = sum(r["positives"] for r in rows)
    return sum(r["ne"] * r["positives"] for r in rows) / tot if tot else float("inf")


def run_baselines(
    train_days: Sequence[str], valid_day: str, eval_day: str, out_dir: str | Path, *, uri: str,
    oracle_uri: str | None = None, seed: int = 0, epochs: int = 4, lr: float = 0.05, l2: float = 1e-6,
    batch_size: int = 1024, features: FeaturesConfig | None = None, surfaces: SurfacesConfig | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Base rate and the logistic regression on every surface: {model: metric rows on E}; writes
    <out_dir>/<model>/eval_predictions.parquet."""
    features = features or load_features()
    surfaces = surfaces or load_surfaces()
    so = storage_options or {}
    out = Path(out_dir)
    torch.manual_seed(seed)
    days = [dt.date.fromisoformat(str(d)) for d in train_days]
    common = {"features": features, "surfaces_config": surfaces, "uri": uri, "storage_options": so}
    train = ExampleStream(days[0], days[-1], batch_size=batch_size, shuffle=True, seed=seed, **common)

    def day(d: str) -> ExampleStream:
        return ExampleStream(d, d, batch_size=8192, shuffle=False, **common)

    oracle = read_oracle([eval_day], uri=oracle_uri, storage_options=so, missing_ok=True) if oracle_uri else None
    names = list(surfaces.names)
    results: dict[str, list[dict[str, Any]]] = {}

    # -- base rate ----------------------------------------------------------------------------
    rates = (pl.scan_delta(uri, storage_options=so).filter(pl.col("date").is_in(days), pl.col("click").is_not_null())
             .group_by("surface").agg(pl.col("click").cast(pl.Float64).mean().alias("rate")).collect())
    rate = dict(zip(rates["surface"].to_list(), rates["rate"].to_list(), strict=True))
    base = _predict(day(eval_day), names, lambda b: np.array([rate.get(names[i], 0.0) for i in b.surface_idx.tolist()]))
    results["base_rate"] = _write(base, out / "base_rate", oracle)

    # -- logistic regression --------------------------------------------------------------------
    mean, std = dense_stats(uri, days, None, features, so)
    feats = LRFeatures(features, mean, std)
    model = HashedLR(feats.n_dense)
    opt = torch.optim.Adagrad(model.parameters(), lr=lr)
    best, best_state, history = float("inf"), None, []
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for b in train:
            m = b.label_mask[:, 0]
            if not bool(m.any()):
                continue
            idx, off, w, dense = feats(b)
            logit = model(idx, off, w, dense)
            loss = nn.functional.binary_cross_entropy_with_logits(logit[m], b.labels[m, 0])
            if l2:
                loss = loss + l2 * (model.w(idx, off).pow(2).sum() + model.dense.weight.pow(2).sum())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        ne = _click_ne(_predict(day(valid_day), names, _lr_score(model, feats)))
        history.append({"epoch": epoch + 1, "valid_click_ne": ne})
        if ne < best:
            best, best_state = ne, copy.deepcopy(model.state_dict())
        else:
            break  # early stopping on E-1
    model.load_state_dict(best_state)
    # the post-hoc map every model of the protocol gets, fitted the same way on the same days (after the window
    # up to E-1): an id the window never saw keeps a zero weight, and with churn most of E's ads are such ids
    score = _lr_score(model, feats)
    cal = fit_model_calibrator(lambda d: _predict(day(d), names, score), calibration_days(days[-1], valid_day), names,
                               min_positives=DEFAULT_CALIBRATION["min_positives"])
    preds = _predict(day(eval_day), names, score)
    preds = preds.with_columns(p_click_raw=pl.col("p_click"),
                               p_click=pl.Series(cal.apply_probs(preds["p_click"].to_numpy(), preds["surface"].to_list())))
    results["logistic_regression"] = _write(preds, out / "logistic_regression", oracle)
    results["_lr_calibration"] = cal.metadata()  # type: ignore[assignment]
    results["_lr_valid_history"] = history  # type: ignore[assignment]
    return results


def _write(preds: pl.DataFrame, out: Path, oracle: pl.DataFrame | None) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    keep = ["request_id", "surface", "click", "p_click"] + (["p_click_raw"] if "p_click_raw" in preds.columns else [])
    preds.filter(pl.col("click_mask")).select(keep).write_parquet(out / "eval_predictions.parquet")
    return [r for r in metric_rows(preds, oracle) if r["task"] == "click"]
