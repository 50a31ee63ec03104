from __future__ import annotations

from gem_pipelines.quality_gate import gate
from gem_pipelines.settings import ModelGate

CFG = ModelGate(min_positives=100, max_ne=1.0, max_regression=0.02)


def row(surface: str, ne: float, positives: int = 500, task: str = "click") -> dict:
    return {"surface": surface, "task": task, "ne": ne, "positives": positives}


def test_gate_passes_good_models_and_ignores_pairs_with_few_positives() -> None:
    result = gate([row("feed", 0.9), row("shops", 1.3, positives=20)], None, CFG)
    assert result["passed"] and [p["surface"] for p in result["gated_pairs"]] == ["feed"]


def test_gate_fails_ne_above_one_and_regressions_against_accepted() -> None:
    assert not gate([row("feed", 1.01)], None, CFG)["passed"]
    regressed = gate([row("feed", 0.93)], [row("feed", 0.90)], CFG)
    assert not regressed["passed"] and "regressed" in regressed["failures"][0]["why"]
    assert gate([row("feed", 0.915)], [row("feed", 0.90)], CFG)["passed"]


def test_gate_with_nothing_to_gate_does_not_pass_silently() -> None:
    result = gate([row("feed", 0.9, positives=3)], None, CFG)
    assert not result["passed"] and "positives" in result["note"]
