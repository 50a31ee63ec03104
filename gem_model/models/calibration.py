"""Post-hoc calibration of a GEM model, a domain model or a student: per (surface, task),
p = sigmoid(a * z + b) on its logit z (Platt scaling: moves a head's mean, keeps its ranking).

A model selected on E-1 by NE can still be biased per surface. The map is fitted by minimising log
loss on the model's own predictions of the days after its training window up to E-1 (never a training
day, never E: `calibration_days`), stored with its weights as plain tensors (weights_only-safe) and
applied by `apply` (`metrics.predict`, `teacher.predict_teacher`, `distill.trainer.predict_student`).
One day's clicks make a noisy map, so each surface's map is shrunk toward a pooled map fitted on every
surface's rows of the same days, with weight positives / (positives + `shrink_positives`) on its own
(a student sees one surface: its prior is the identity). A head with fewer than `min_positives`
positives gets the pooled map alone (identity when the pooled rows have fewer too).

A surface's level is its own: a mean needs far fewer clicks than a slope, and a pooled map dominated by
the big surfaces carries their bias, not a small surface's. With `level_positives` k_l set, the blended
map is shifted on the logit scale toward the shift that matches the surface's own click rate on the
fitting days, with weight positives / (positives + k_l). None: the blend alone (maps stored before).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.data.loader import TASKS, date_range

DEFAULT_CALIBRATION: dict[str, Any] = {
    "enabled": True,
    "min_positives": 30,  # fewer positives: no own map (two parameters from a handful of clicks would overfit)
    # a surface's own map weighs positives / (positives + this) against the pooled one: about one day's
    # clicks of a surface in the evaluation world, so one day's map counts half
    "shrink_positives": 300,
    # the shift toward a surface's own click rate weighs positives / (positives + this): a bias of one
    # surface the pooled map cannot see (the demo world's shops: 1.2-1.3); bench/RESULTS.md
    "level_positives": 10,
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
    if w[0] < 0:  # the rows rank backwards (a few noisy positives): a map must not reverse the model's ranking
        return 1.0, fit_shift(z, y)
    return float(w[0]), float(w[1])


def fit_shift(z: np.ndarray, y: np.ndarray, *, iters: int = 50) -> float:
    """b minimising the mean log loss of sigmoid(z + b): the slope stays 1, only the mean moves."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    b = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(z + b)))
        step = (p.mean() - y.mean()) / max(float(np.mean(p * (1 - p))), 1e-12)
        b -= float(np.clip(step, -5.0, 5.0))
        if abs(step) < 1e-10:
            break
    return b


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
    fit_day: str | None = None  # the fitting days, comma-separated
    min_positives: int = DEFAULT_CALIBRATION["min_positives"]
    info: dict[str, Any] = field(default_factory=dict)
    shrink_positives: float = 0.0  # 0: each head's own map alone (the rule before pooling)
    prior: str = "identity"  # what each surface's map is shrunk toward: "pooled" | "identity"
    weight: torch.Tensor | None = None  # float64 [S, T]: the weight of the surface's own map
    level_positives: float | None = None  # None: no shift toward each surface's own rate (maps stored before)

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

    def apply_probs(self, p: np.ndarray, surfaces: list[str] | np.ndarray, task: str = "click") -> np.ndarray:
        """Probabilities of any scorer (e.g. the oracle's, behind a map fitted the same way on the same
        days) through this calibrator's `task` head of each row's surface (by name)."""
        idx = np.array([self.surfaces.index(s) for s in surfaces], dtype=np.int64)
        j = TASKS.index(task)
        z = logit(p)
        a, b = self.a[:, j].numpy()[idx], self.b[:, j].numpy()[idx]
        return 1.0 / (1.0 + np.exp(-(a * z + b)))

    def state(self) -> dict[str, Any]:
        """Plain tensors, strings and ints: what model.pt carries (weights_only-safe)."""
        return {"surfaces": list(self.surfaces), "a": self.a.clone(), "b": self.b.clone(), "fitted": self.fitted.clone(),
                "positives": self.positives.clone(), "fit_day": self.fit_day or "", "min_positives": int(self.min_positives),
                "shrink_positives": float(self.shrink_positives), "prior": self.prior,
                **({"weight": self.weight.clone()} if self.weight is not None else {}),
                **({"level_positives": float(self.level_positives)} if self.level_positives is not None else {})}

    @classmethod
    def from_state(cls, st: dict[str, Any]) -> Calibrator:
        return cls(list(st["surfaces"]), st["a"].double(), st["b"].double(), st["fitted"].bool(), st["positives"].long(),
                   st.get("fit_day") or None, int(st.get("min_positives", DEFAULT_CALIBRATION["min_positives"])),
                   shrink_positives=float(st.get("shrink_positives", 0.0)), prior=str(st.get("prior", "identity")),
                   weight=st["weight"].double() if st.get("weight") is not None else None,
                   level_positives=float(st["level_positives"]) if st.get("level_positives") is not None else None)

    def metadata(self) -> dict[str, Any]:
        """{surface: {task: {a, b, fitted, positives}}}: what the asset metadata shows."""
        out: dict[str, Any] = {"fit_day": self.fit_day, "min_positives": self.min_positives,
                               "shrink_positives": self.shrink_positives, "prior": self.prior,
                               "level_positives": self.level_positives, "heads": {}}
        for i, s in enumerate(self.surfaces):
            out["heads"][s] = {t: {"a": float(self.a[i, j]), "b": float(self.b[i, j]), "fitted": bool(self.fitted[i, j]),
                                   "positives": int(self.positives[i, j]),
                                   **({"own_weight": float(self.weight[i, j])} if self.weight is not None else {}),
                                   **({} if self.fitted[i, j] else {"why": f"identity: {int(self.positives[i, j])} "
                                                                          f"positives < {self.min_positives}"})}
                               for j, t in enumerate(TASKS)}
        return out


def calibration_days(train_end: Any, valid: Any) -> list[str]:
    """The days a model's map is fitted on: every day after its training window up to the validation
    day (inclusive): never a training day, never E. ISO strings."""
    first = dt.date.fromisoformat(str(train_end)) + dt.timedelta(days=1)
    last = dt.date.fromisoformat(str(valid))
    return [d.isoformat() for d in date_range(first, last)] or [last.isoformat()]


def refit_days(day: dt.date, fit_day: str | None) -> list[dt.date] | None:
    """The days a map for scoring `day` is re-fitted on once the model's own is stale for it (labelled
    days lie between its fitting days and `day`: the weeks between retrains of a moving world): as many
    days as it was fitted on, ending the day before `day`, none before its first fitting day (never a
    training day). None while the stored map is the freshest (`day` follows its fitting days at once)."""
    if not fit_day:
        return None
    fit = sorted(dt.date.fromisoformat(d) for d in fit_day.split(","))
    last = day - dt.timedelta(days=1)
    if last <= fit[-1]:
        return None
    return date_range(max(fit[0], last - dt.timedelta(days=len(fit) - 1)), last)


def refit(cal: Calibrator, preds: pl.DataFrame, days: list[dt.date]) -> Calibrator:
    """`cal`'s rule (min_positives, shrinkage, prior, level) fitted anew on `preds` of `days`."""
    return fit_calibrator(preds, cal.surfaces, min_positives=cal.min_positives, fit_day=",".join(map(str, days)),
                          shrink_positives=cal.shrink_positives, prior=cal.prior, level_positives=cal.level_positives)


def fit_calibrator(preds: pl.DataFrame, surfaces: list[str], *, min_positives: int, fit_day: str | None = None,
                   shrink_positives: float = 0.0, prior: str = "pooled",
                   level_positives: float | None = None) -> Calibrator:
    """A Calibrator from `metrics.predict` output of the fitting days (raw probabilities: the
    p_<task>_raw columns when present); see the module doc for the rule.

    shrink_positives: 0 fits each head on its own rows alone (no pooling). prior: "pooled" (a map
    fitted on every surface's rows of `preds`, per task) or "identity" (a one-surface model).
    level_positives: None keeps the blend; else the shift toward the surface's own rate (module doc)."""
    if prior not in ("pooled", "identity"):
        raise ValueError(f"calibration prior must be 'pooled' or 'identity', not {prior!r}")
    if shrink_positives < 0:
        raise ValueError(f"calibration shrink_positives must be >= 0, not {shrink_positives}")
    if level_positives is not None and level_positives < 0:
        raise ValueError(f"calibration level_positives must be >= 0, not {level_positives}")
    cal = Calibrator.identity(surfaces)
    cal.level_positives = None if level_positives is None else float(level_positives)
    cal.fit_day, cal.min_positives = fit_day, int(min_positives)
    cal.shrink_positives, cal.prior = float(shrink_positives), prior
    cal.weight = torch.zeros(len(surfaces), len(TASKS), dtype=torch.float64)
    pooled_on = shrink_positives > 0 and prior == "pooled"
    for j, t in enumerate(TASKS):
        col = f"p_{t}_raw" if f"p_{t}_raw" in preds.columns else f"p_{t}"
        rows = preds.filter(pl.col(f"{t}_mask") & pl.col("surface").is_in(list(surfaces)))
        pooled, pooled_fitted = (1.0, 0.0), False
        y_all = rows[t].to_numpy().astype(np.float64)
        if pooled_on and min_positives <= y_all.sum() < len(y_all):
            pooled, pooled_fitted = fit_platt(logit(rows[col].to_numpy()), y_all), True
        for i, s in enumerate(surfaces):
            sub = rows.filter(pl.col("surface") == s)
            y = sub[t].to_numpy().astype(np.float64)
            pos = int(y.sum())
            cal.positives[i, j] = pos
            if len(y) == 0:  # a surface the model is not scored on (a domain model's other domains)
                continue
            own_ok = min_positives <= pos < len(y)
            if not own_ok and not pooled_fitted:
                continue
            z = logit(sub[col].to_numpy())
            own = fit_platt(z, y) if own_ok else pooled
            w = 1.0 if shrink_positives == 0 else (pos / (pos + shrink_positives) if own_ok else 0.0)
            a, b = w * own[0] + (1 - w) * pooled[0], w * own[1] + (1 - w) * pooled[1]
            if own_ok and level_positives is not None and w < 1:
                b += pos / (pos + level_positives) * fit_shift(a * z + b, y)
            cal.a[i, j], cal.b[i, j] = a, b
            cal.fitted[i, j], cal.weight[i, j] = True, w
    return cal


def fit_model_calibrator(predict_day: Callable[[str], pl.DataFrame], days: list[str], surfaces: list[str], *,
                         min_positives: int, shrink_positives: float = DEFAULT_CALIBRATION["shrink_positives"],
                         prior: str = "pooled",
                         level_positives: float | None = DEFAULT_CALIBRATION["level_positives"]) -> Calibrator:
    """`fit_calibrator` on the raw predictions of every day of `days` (`predict_day(day)`: the
    model's `metrics.predict` output of that day, with no calibrator applied or with p_*_raw)."""
    preds = pl.concat([predict_day(d) for d in days], how="diagonal_relaxed")
    return fit_calibrator(preds, surfaces, min_positives=min_positives, fit_day=",".join(days),
                          shrink_positives=shrink_positives, prior=prior, level_positives=level_positives)


def apply(model: torch.nn.Module, logits: torch.Tensor, surface_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(probabilities used for scoring, raw probabilities or None): the model's calibrator when it
    carries one (`model.calibrator`, set by registry.load_model / train after selection)."""
    raw = torch.sigmoid(logits.float())
    cal: Calibrator | None = getattr(model, "calibrator", None)
    if cal is None:
        return raw, None
    return cal.apply_logits(logits, surface_idx), raw
