"""Check thresholds from assets/quality.yaml."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gem_model.config import _load, _Strict, spec_path


class ModelGate(_Strict):
    min_positives: int = Field(default=100, ge=0)
    max_ne: float = Field(default=1.0, gt=0)
    max_regression: float = Field(default=0.02, ge=0)
    max_vs_labels_only: float = Field(default=0.02, ge=0)


class StudentSelection(_Strict):
    keep_accepted_within: float = Field(default=0.005, ge=0)


class QualityConfig(_Strict):
    quarantine_warn_rate: float = Field(default=0.01, ge=0, le=1)
    quarantine_fail_rate: float = Field(default=0.10, ge=0, le=1)
    freshness_hours: dict[str, float] = Field(default_factory=lambda: {"events": 36, "training_examples": 36})
    model_gate: ModelGate = ModelGate()
    student_selection: StudentSelection = StudentSelection()


def load_quality(path: Path | None = None) -> QualityConfig:
    return _load(QualityConfig, path or spec_path("quality.yaml"))


QUALITY = load_quality()
QUARANTINE_WARN_RATE = QUALITY.quarantine_warn_rate
QUARANTINE_FAIL_RATE = QUALITY.quarantine_fail_rate
