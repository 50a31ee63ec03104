"""Pipeline settings: the checks' thresholds (assets/quality.yaml), the training steps' and the runs' retries
(assets/retries.yaml)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field, model_validator

from gem_model.config import _load, _Strict, spec_path


class ModelGate(_Strict):
    min_positives: int = Field(default=100, ge=0)
    max_ne: float = Field(default=1.0, gt=0)
    max_regression: float = Field(default=0.02, ge=0)
    max_vs_labels_only: float = Field(default=0.02, ge=0)


class StudentSelection(_Strict):
    keep_accepted_within: float = Field(default=0.005, ge=0)


class FreshnessHours(_Strict):  # the assets with a freshness check (gem_pipelines/checks.py)
    events: float = Field(default=36, gt=0)
    training_examples: float = Field(default=36, gt=0)


class QualityConfig(_Strict):
    quarantine_warn_rate: float = Field(default=0.01, ge=0, le=1)
    quarantine_fail_rate: float = Field(default=0.10, ge=0, le=1)
    freshness_hours: FreshnessHours = FreshnessHours()
    model_gate: ModelGate = ModelGate()
    student_selection: StudentSelection = StudentSelection()

    @model_validator(mode="after")
    def _warn_before_fail(self) -> QualityConfig:
        if self.quarantine_warn_rate > self.quarantine_fail_rate:  # the rate check tests warn first: fail never came
            raise ValueError(f"quarantine_warn_rate {self.quarantine_warn_rate} is above quarantine_fail_rate "
                             f"{self.quarantine_fail_rate}")
        return self


def load_quality(path: Path | None = None) -> QualityConfig:
    return _load(QualityConfig, path or spec_path("quality.yaml"))


QUALITY = load_quality()
QUARANTINE_WARN_RATE = QUALITY.quarantine_warn_rate
QUARANTINE_FAIL_RATE = QUALITY.quarantine_fail_rate


class TrainingRetries(_Strict):
    max_retries: int = Field(default=2, ge=0)
    delay_s: float = Field(default=10, ge=0)

    def policy(self) -> dg.RetryPolicy | None:
        """The Dagster step retry policy of the training assets (None: no retry)."""
        if not self.max_retries:
            return None
        return dg.RetryPolicy(max_retries=self.max_retries, delay=self.delay_s, backoff=dg.Backoff.EXPONENTIAL)


class RunRetries(_Strict):
    max_retries: int = Field(default=1, ge=0)
    check_every_s: int = Field(default=30, ge=1)


class RetriesConfig(_Strict):
    training: TrainingRetries = TrainingRetries()
    runs: RunRetries = RunRetries()


def load_retries(path: Path | None = None) -> RetriesConfig:
    return _load(RetriesConfig, path or spec_path("retries.yaml"))


RETRIES = load_retries()
TRAINING_RETRY = RETRIES.training.policy()
