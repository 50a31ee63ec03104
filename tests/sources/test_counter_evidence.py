"""The real-data report's counter evidence: per surface, what the counters read on the teacher's
window, on E-1 and on E (the calendar's roles), from features alone."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from gem_pipelines.sources.report import EVIDENCE, counter_evidence, to_markdown


def test_evidence_is_averaged_per_surface_and_role_day_without_reading_a_label(gem_home) -> None:
    # the default calendar: warm-up 11-01, teacher 11-02..11-04, students only 11-05, E-1 11-06, E 11-07
    spec = [("2026-11-01", "feed", 99.0), ("2026-11-02", "feed", 2.0), ("2026-11-04", "feed", 4.0),
            ("2026-11-05", "feed", 99.0), ("2026-11-06", "feed", 10.0), ("2026-11-07", "feed", 20.0),
            ("2026-11-07", "feed", 30.0), ("2026-11-07", "reels", 5.0), ("2026-11-07", "shops", 99.0)]
    lake = pl.DataFrame({
        "date": [dt.date.fromisoformat(d) for d, _, _ in spec],
        "surface": [s for _, s, _ in spec],
        **{c: [v * (k + 1) for _, _, v in spec] for k, c in enumerate(EVIDENCE)},
    })  # no click column: a label is never read
    lake.write_delta(str(gem_home / "lake" / "training_examples"), delta_write_options={"partition_by": ["date"]})

    rows = counter_evidence(["reels", "feed"])
    assert [(r["surface"], r["role"], r["rows"]) for r in rows] == [
        ("reels", "evaluation", 1), ("feed", "teacher", 2), ("feed", "validation", 1), ("feed", "evaluation", 2)]
    feed = {r["role"]: r for r in rows if r["surface"] == "feed"}
    assert [feed[role][EVIDENCE[0]] for role in ("teacher", "validation", "evaluation")] == [3.0, 10.0, 25.0]
    assert feed["evaluation"][EVIDENCE[2]] == pytest.approx(75.0)  # each counter its own mean
    md = to_markdown({"dataset": "x", "evaluation_day": "2026-11-07", "oracle": "none", "foundation_version": None,
                      "foundation_accepted": False, "rows": [], "hierarchical": {}, "counter_evidence": rows})
    assert "| feed | evaluation | 2 | 25.0 | 50.0 | 75.0 | 100.0 |" in md
