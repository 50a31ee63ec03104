"""Post-hoc calibration of a GEM model: per (surface, task), p = sigmoid(a * z + b) on its logit z.

Why: a model selected on E-1 by NE can still be biased per surface (the evaluation world measured
mean prediction / click rate of 0.92-1.06 on E). Two parameters per head (Platt scaling) move the
mean without touching the ranking. They are fitted by minimising log loss on the predictions of the
selected checkpoint on the validation day E-1 (never on E), stored in model.pt as plain tensors
(`torch.load(weights_only=True)` still loads it) and applied by the one function that turns logits
into probabilities for scoring (`apply`, called by `metrics.predict` and `teacher.predict_teacher`).
A head with fewer than `min_positives` positives on E-1 keeps the identity map (a=1, b=0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.data.loader import TASKS

DEFAULT_CALIBRATION: dict[str, Any] = {
    "enabled": True,
    "min_positives": 30,  # fewer positives on E-1: identity (two parameters from a handful of clicks would overfit)
}
_EPS = 1e-7


def fit_platt(z: np.ndarray, y: np.ndarray, *, iters: int = 50, ridge: float = 1e-6) -> tuple[float, float]:
    """(a, b) minimising the mean log loss of sigmoid(a*z + b) against y: Newton steps with
    step halving (the loss is convex in (a, b)); starts at the identity."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x = np.stack([z, np.ones_like(z)], 1)
    w = np.array([1.0, 0.0])

    def loss(w: np.ndarray) -> float:
        s = x @ w
        # log(1 + e^s) - y*s, stable; ridge toward the identity keeps a degenerate set finite
        return float(np.mean(np.logaddexp(0.0, s) - y * s) + ridge * ((w[0] - 1) ** 2 + w[1] ** 2))

    cur = loss(w)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        g = x.T @ (p - y) / len(y) + 2 * ridge * (w - np.array([1.0, 0.0]))
        h = (x * (p * (1 - p))[:, None]).T @ x / len(y) + 2 * ridge * np.eye(2)
        step = np.linalg.solve(h, g)
        t = 1.0
        while t > 1e-6:
            new = loss(w - t * step)
            if new <= cur:
                break
            t /= 2
        if t <= 1e-6:
            break
        w, prev, cur = w - t * step, cur, new
        if prev - cur < 1e-12:
            break
    return float(w[0]), float(w[1])


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


@dataclass
class Calibrator:
    """a, b: [n_surfaces, n_tasks] (identity where not fitted); info: per head why/with what."""

    surfaces: list[str]
    a: torch.Tensor
    b: torch.Tensor
    fitted: torch.Tensor  # bool [S, T]
    positives: torch.Tensor  # long [S, T]: positives on the fitting day
    fit_day: str | None = None
    min_positives: int = DEFAULT_CALIBRATION["min_positives"]
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def identity(cls, surfaces: list[str]) -> Calibrator:
        s, t = len(surfaces), len(TASKS)
        return cls(list(surfaces), torch.ones(s, t, dtype=torch.float64), torch.zeros(s, t, dtype=torch.float64),
                   torch.zeros(s, t, dtype=torch.bool), torch.zeros(s, t, dtype=torch.long))

    def apply_logits(self, logits: torch.Tensor, surface_idx: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities [B, T] from logits [B, T] (fp32 math)."""
        a = self.a.to(logits.device, torch.float32)[surface_idx]
        b = self.b.to(logits.device, torch.float32)[surface_idx]
        return torch.sigmoid(a * logits.float() + b)

    def state(self) -> dict[str, Any]:
        """Plain tensors, strings and ints: what model.pt carries (weights_only-safe)."""
        return {"surfaces": list(self.surfaces), "a": self.a.clone(), "b": self.b.clone(), "fitted": self.fitted.clone(),
                "positives": self.positives.clone(), "fit_day": self.fit_day or "", "min_positives": int(self.min_positives)}

    @classmethod
    def from_state(cls, st: dict[str, Any]) -> Calibrator:
        return cls(list(st["surfaces"]), st["a"].double(), st["b"].double(), st["fitted"].bool(), st["positives"].long(),
                   st.get("fit_day") or None, int(st.get("min_positives", DEFAULT_CALIBRATION["min_positives"])))

    def metadata(self) -> dict[str, Any]:
        """{surface: {task: {a, b, fitted, positives}}}: what the asset metadata shows."""
        out: dict[str, Any] = {"fit_day": self.fit_day, "min_positives": self.min_positives, "heads": {}}
        for i, s in enumerate(self.surfaces):
            out["heads"][s] = {t: {"a": float(self.a[i, j]), "b": float(self.b[i, j]), "fitted": bool(self.fitted[i, j]),
                                   "positives": int(self.positives[i, j]),
                                   **({} if self.fitted[i, j] else {"why": f"identity: {int(self.positives[i, j])} "
                                                                          f"positives < {self.min_positives}"})}
                               for j, t in enumerate(TASKS)}
        return out


def fit_calibrator(preds: pl.DataFrame, surfaces: list[str], *, min_positives: int, fit_day: str | None = None) -> Calibrator:
    """A Calibrator from `metrics.predict` output of the validation day (raw probabilities: the
    p_<task>_raw columns when present). Heads with < min_positives positives keep the identity."""
    cal = Calibrator.identity(surfaces)
    cal.fit_day, cal.min_positives = fit_day, int(min_positives)
    for i, s in enumerate(surfaces):
        sub = preds.filter(pl.col("surface") == s)
        for j, t in enumerate(TASKS):
            rows = sub.filter(pl.col(f"{t}_mask"))
            col = f"p_{t}_raw" if f"p_{t}_raw" in rows.columns else f"p_{t}"
            y = rows[t].to_numpy().astype(np.float64)
            pos = int(y.sum())
            cal.positives[i, j] = pos
            if pos < min_positives or pos == len(y):
                continue
            a, b = fit_platt(logit(rows[col].to_numpy()), y)
            cal.a[i, j], cal.b[i, j], cal.fitted[i, j] = a, b, True
    return cal


def apply(model: torch.nn.Module, logits: torch.Tensor, surface_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(probabilities used for scoring, raw probabilities or None): the model's calibrator when it
    carries one (`model.calibrator`, set by registry.load_model / train after selection)."""
    raw = torch.sigmoid(logits.float())
    cal: Calibrator | None = getattr(model, "calibrator", None)
    if cal is None:
        return raw, None
    return cal.apply_logits(logits, surface_idx), raw
