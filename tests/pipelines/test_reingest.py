"""Re-ingesting one day from the UI leaves no stale partition green: on a copy of the session's demo
world (window 2026-11-02..06), one `events` partition is materialized again through the instance as
the UI does, then the automation runs as `make next-day` runs it. Every partition downstream is
rebuilt, under its job, or marked stale (the models that wait for their cadence); no run fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("reingest_driver.py")
SURFACES = ("feed", "reels", "marketplace", "shops")
DAY = "2026-11-04"
LATER = ("2026-11-04", "2026-11-05", "2026-11-06")  # training_examples' histories read D for a week after it


@pytest.mark.timeout(3000)
def test_reingesting_one_day_rebuilds_or_marks_every_downstream_partition(demo_copy: dict[str, str],
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "reingest.json"
    proc = subprocess.run([sys.executable, str(DRIVER), f"{DAY}|feed", str(out)], env=demo_copy,
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["reingest"]["status"] == "SUCCESS"
    changed = {k for k, v in doc["after"].items() if doc["before"].get(k) != v}
    ingested = {f"{t}[{DAY}|feed]" for t in ("events", "user_activity", "events_quarantine")}
    rebuilt = ({f"activity_by_day[{DAY}]", "distillation_report[]"}
               | {f"{a}[{d}]" for a in ("training_examples", "teacher_predictions") for d in LATER}
               | {f"students[{s}]" for s in SURFACES}
               | {f"foundation_refresh[{LATER[-1]}]"})  # the newest day's refresh follows its data (a no-op here)
    assert changed == ingested | rebuilt
    # the models that wait on purpose (the teacher's weekly cadence, the domain models on their teacher, the
    # refreshes of days already served) are marked stale, naming the re-ingested inputs; nothing else is older
    # than an input
    waiting = {"foundation_model[]", "domain_models[commerce]", "domain_models[social]"}
    # a day's refresh reads the examples up to that day
    refreshes = {f"foundation_refresh[{d}]": {f"training_examples[{x}]" for x in LATER if x <= d} for d in LATER[:-1]}
    assert set(doc["summary"]["stale"]) == waiting | set(refreshes)
    assert {k: set(v) for k, v in doc["stale_marks"].items()} == {
        k: {f"training_examples[{d}]" for d in LATER} for k in waiting} | refreshes
    # no failed run, nothing left waiting, no backfill; every automation run under a named job
    assert doc["summary"]["failed"] == [] and doc["summary"]["not_run"] == []
    assert all(r["status"] == "SUCCESS" for r in doc["runs"]), doc["runs"]
    assert all(b["status"] != "FAILED" for b in doc["backfills"]), doc["backfills"]
    automation = [r for r in doc["runs"] if r["trigger"] == "automation"]
    assert len(automation) == 1 + 2 + 3 + 1 + 4  # features D, D+1..2, predictions x3 (one with D+2's refresh), report, students x4
    assert {r["job_name"] for r in automation} == {"features_job", "teacher_predictions_job",
                                                    "distillation_report_job", "students_job"}
