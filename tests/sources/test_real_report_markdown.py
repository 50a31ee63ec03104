"""The real-data report's table: each model's figures in its own column, their paired difference, the calibration
of both."""

from __future__ import annotations

import pytest

from gem_pipelines.sources.report import main, to_markdown


def _block(ne: float, auc: float, cal: float) -> dict[str, object]:
    return {"n": 1549, "positives": 144, "ne": ne, "ne_ci": (ne - 0.02, ne + 0.02), "auc": auc,
            "auc_ci": (auc - 0.04, auc + 0.04), "calibration": cal, "calibration_ci": (cal - 0.1, cal + 0.1)}


def test_the_table_shows_the_paired_difference_and_the_calibration_of_both_models() -> None:
    row = {"surface": "tab_0", "task": "click", "peer_ne": None,
           "foundation": _block(0.964, 0.640, 0.833), "single_surface": _block(0.955, 0.667, 0.853),
           "foundation_minus_single": {"diff": 0.0099, "lo": -0.0054, "hi": 0.0249, "verdict": "no difference shown"}}
    alone = {k: v for k, v in row.items() if k != "foundation_minus_single"} | {"surface": "tab_2", "single_surface": None}
    md = to_markdown({"dataset": "x", "evaluation_day": "2022-05-03", "oracle": "none", "foundation_version": "v",
                      "foundation_accepted": True, "rows": [row, alone], "hierarchical": {}})
    header = next(line for line in md.splitlines() if line.startswith("| surface"))
    assert header.endswith("| foundation calibration | single-surface calibration |")
    assert ("| tab_0 | click | 1549 | 144 | 0.964 [0.944, 0.984] | 0.955 [0.935, 0.975] | +0.0099 [-0.0054, +0.0249] "
            "(no difference shown) | - | 0.640 [0.600, 0.680] | 0.667 [0.627, 0.707] | 0.833 [0.733, 0.933] | "
            "0.853 [0.753, 0.953] |") in md
    tab_2 = next(line for line in md.splitlines() if line.startswith("| tab_2"))  # no baseline: no difference either
    assert tab_2.endswith("| 0.833 [0.733, 0.933] | n/a |") and tab_2.split("|")[7].strip() == "n/a"
    rows = [line for line in md.splitlines() if line.startswith("| tab_")]
    assert {line.count("|") for line in rows} == {header.count("|")}


def test_the_command_refuses_a_home_without_a_foundation(gem_home, monkeypatch) -> None:
    """Run before the demo (or with another GEM_HOME), it once wrote an empty table and exited 0."""
    monkeypatch.setenv("GEM_DATA", "douban")
    with pytest.raises(SystemExit, match=r"no foundation_model under .*: run `make demo DATA=douban` first"):
        main([])
    assert not (gem_home / "reports").exists()
