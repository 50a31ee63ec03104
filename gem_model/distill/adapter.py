"""Student Adapter: a small model fitted on the freshest labelled day only (E-2), mapping teacher
predictions to calibrated distillation targets.

Per task: p' = sigmoid(a * logit(p_teacher) + b + w . x), x = a few standardised dense features
(students.yaml adapter.features), fitted by Newton / IRLS with a ridge penalty on w (Platt scaling
plus a few features). The teacher trains on older days than the student, so the adapter corrects
the staleness of its calibration with the newest labels. One adapter per student (= per surface).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import torch

from gem_model.data.loader import TASKS
from gem_model.distill.dataset import StudentData

_EPS = 1e-6
MIN_POSITIVES = 5  # fewer positives than this on the day: keep the teacher as it is for that task


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


class StudentAdapter:
    def __init__(self, feature_idx: list[int], feature_names: list[str], l2: float = 1.0, iters: int = 25):
        self.feature_idx = list(feature_idx)
        self.feature_names = list(feature_names)
        self.l2 = float(l2)
        self.iters = int(iters)
        self.mean = np.zeros(len(feature_idx))
        self.std = np.ones(len(feature_idx))
        self.coef: dict[str, list[float]] = {t: [1.0, 0.0] + [0.0] * len(feature_idx) for t in TASKS}
        self.fitted_dates: list[dt.date] = []
        self.stats: dict[str, dict[str, float]] = {}

    def _design(self, data: StudentData, task: int) -> np.ndarray:
        p = data.teacher_p[:, task].numpy().astype(np.float64)
        x = (data.dense[:, self.feature_idx].numpy().astype(np.float64) - self.mean) / self.std
        return np.column_stack([_logit(np.nan_to_num(p, nan=0.5)), np.ones(len(p)), x])

    def fit(self, data: StudentData, day: dt.date) -> StudentAdapter:
        """Fit on the rows of `data` dated `day` alone (the freshest labelled day, E-2)."""
        if data.teacher_p is None:
            raise ValueError("the adapter needs teacher predictions (attach_teacher first)")
        data = data.on_dates([day])
        if len(data) == 0:
            raise ValueError(f"no rows on the adapter day {day}")
        self.fitted_dates = data.date_set
        x = data.dense[:, self.feature_idx].numpy().astype(np.float64)
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6
        for t, task in enumerate(TASKS):
            ok = (data.label_mask[:, t] & ~torch.isnan(data.teacher_p[:, t])).numpy()
            y = data.labels[:, t].numpy().astype(np.float64)[ok]
            pos = int(y.sum())
            self.stats[task] = {"n": int(ok.sum()), "positives": pos}
            if pos < MIN_POSITIVES or pos == len(y):
                continue  # identity: too few labels to correct anything
            X = self._design(data, t)[ok]
            beta = np.array(self.coef[task], dtype=np.float64)
            pen = np.array([1e-4, 1e-6] + [self.l2] * len(self.feature_idx))
            prior = np.array([1.0, 0.0] + [0.0] * len(self.feature_idx))
            for _ in range(self.iters):
                z = X @ beta
                mu = 1.0 / (1.0 + np.exp(-z))
                g = X.T @ (mu - y) + pen * (beta - prior)
                H = (X * (mu * (1 - mu))[:, None]).T @ X + np.diag(pen)
                step = np.linalg.solve(H, g)
                beta = beta - step
                if np.abs(step).max() < 1e-8:
                    break
            self.coef[task] = beta.tolist()
        return self

    def transform(self, data: StudentData) -> torch.Tensor:
        """Adapted teacher probabilities [N, 2] (NaN where the teacher has none)."""
        out = np.full((len(data), len(TASKS)), np.nan, dtype=np.float32)
        for t, task in enumerate(TASKS):
            z = self._design(data, t) @ np.asarray(self.coef[task])
            out[:, t] = 1.0 / (1.0 + np.exp(-z))
        out[torch.isnan(data.teacher_p).numpy()] = np.nan
        return torch.from_numpy(out)

    def to_dict(self) -> dict[str, Any]:
        return {"features": self.feature_names, "l2": self.l2, "mean": self.mean.tolist(), "std": self.std.tolist(),
                "coef": self.coef, "fitted_dates": [d.isoformat() for d in self.fitted_dates], "stats": self.stats}
