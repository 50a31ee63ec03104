"""Three days in the life of the demo world (`make next-day`, then `make next-day DAYS=2` as `make week`
runs its days, on a copy of the session's demo): the automation alone (schedule and sensor through
their own evaluation contexts, automation conditions through `dg.evaluate_automation_conditions`; no
daemon, no sleeps) lands and ingests each new day, rebuilds its features, refreshes the foundation
that serves it (the one that served the day before, continued on the day that entered its window),
its teacher predictions, the distillation report and the students, and on its cadence (Mondays)
retrains the foundation model, then the domain models and every day's teacher predictions; nothing
else moves. Every automation run is listed under its job, and each day adds its rows to the
days-in-the-life report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from gem_model.distill.arms import ARMS
from gem_model.distill.run import DEFAULT_ARMS
from gem_model.distill.serving_fold_in import FOLD_STATUS
from gem_pipelines.quality_gate import untraced_accepted

pytestmark = pytest.mark.slow

SURFACES = ("feed", "reels", "marketplace", "shops")
LAKE = ("events", "user_activity", "events_quarantine", "oracle", "training_examples", "teacher_predictions")


def _partitions(home: Path) -> dict[tuple[str, str], frozenset[str]]:
    """(table, partition) -> the data files that hold it now (a rewrite replaces them)."""
    out: dict[tuple[str, str], set[str]] = {}
    for table in LAKE:
        actions = pa.table(DeltaTable(str(home / "lake" / table)).get_add_actions(flatten=True))
        for a in actions.to_pylist():
            key = "|".join(str(a[c]) for c in ("partition.date", "partition.surface") if c in a)
            out.setdefault((table, key), set()).add(a["path"])
    return {k: frozenset(v) for k, v in out.items()}


def _accepted(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home / "models")): p.read_text().strip()
            for p in sorted((home / "models").rglob("ACCEPTED"))}


def _next_day(env: dict[str, str], tmp: Path, days: int = 1):
    """`make next-day DAYS=<days>`: the day's summary (a list of them for several days)."""
    out = tmp / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "gem_pipelines.next_day", "--days", str(days), "--summary", str(out)],
                          env=env, capture_output=True, text=True, timeout=1500 * days)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def _network(arm: str) -> tuple[bool, bool]:
    """What of an arm changes the student's network: an aux head, the teacher-embedding input."""
    spec = ARMS[arm]
    return spec["kd"] == "aux", spec["representation"]


def _warm_starts(home: Path, before: dict[str, str], after: dict[str, str]) -> int:
    """Each new ACCEPTED student kept the (arm, path) it replaces unless the day's report found one
    better on E-1 by more than the margin, and started from the student it replaces whenever the
    network is the same (cold otherwise, saying why). Returns how many warm-started."""
    report = json.loads((home / "reports" / "distillation_report.json").read_text())
    warm = 0
    for s in SURFACES:
        key = f"students/{s}/ACCEPTED"
        old, new = (json.loads((home / "models" / "students" / s / v[key] / "metrics.json").read_text())["key"]
                    for v in (before, after))
        train = json.loads((home / "models" / "students" / s / after[key] / "metrics.json").read_text())["train"]
        old_pair, new_pair = (old["arm"], old["path"]), (new["arm"], new["path"])
        assert report["selected"][s] == {"arm": new["arm"], "path": new["path"],
                                         "kept_accepted": old_pair == new_pair}
        if old_pair != new_pair and report["arms"] == report["selection"]["arms"]:  # selected today, on E-1
            val = {(r["arm"], r["path"]): r["ne"] for r in report["rows"]
                   if r["surface"] == s and r["split"] == "validation" and r["task"] == "click"}
            assert val[old_pair] - val[new_pair] > report["keep_accepted_within"], (s, old_pair, new_pair, val)
        if _network(old["arm"]) == _network(new["arm"]):
            assert train["warm_start"] == "warm", (s, train["warm_start"])
            assert Path(train["warm_start_from"]) == home / "models" / "students" / s / before[key]
            warm += 1
        else:
            assert train["warm_start"].startswith("cold: the ACCEPTED student differs in "), (s, train["warm_start"])
    return warm


def _report_arms(home: Path, selection_on: str) -> list[str]:
    """The arms the day's distillation report trained; its selection was made on `selection_on` (E-1),
    comparing every arm, with the teachers now ACCEPTED."""
    report = json.loads((home / "reports" / "distillation_report.json").read_text())
    assert report["selection"]["on"] == selection_on and report["selection"]["arms"] == sorted(DEFAULT_ARMS)
    accepted = {"foundation": (home / "models" / "foundation_model" / "ACCEPTED").read_text().strip()}
    accepted |= {f"domain:{d}": (home / "models" / "domain_models" / d / "ACCEPTED").read_text().strip()
                 for d in ("commerce", "social")}
    assert report["selection"]["teachers"] == accepted
    return report["arms"]


def _served(home: Path, day: str, version: str, continues: str | None = None, trained: str | None = None) -> None:
    """`day`'s foundation predictions are `version`'s; a refresh (`continues` given) continued that version on
    the one day `trained` and records the ACCEPTED foundation as its root."""
    tp = DeltaTable(str(home / "lake" / "teacher_predictions")).to_pyarrow_table(
        partitions=[("date", "=", day)], columns=["teacher", "teacher_version"]).to_pylist()
    assert {r["teacher_version"] for r in tp if r["teacher"] == "foundation"} == {version}
    if continues is not None:
        vdir = home / "models" / "foundation_refresh" / day.replace("-", "") / version
        record = json.loads((vdir / "refresh.json").read_text())
        assert record == {"root": continues, "init": continues, "day": day, "train_days": [trained, trained]}
        assert json.loads((vdir / "config.json").read_text())["data"]["train"] == [trained, trained]


def _assert_day(changed: set[tuple[str, str]], expected: set[tuple[str, str]]) -> None:
    """The day rewrote exactly `expected`, but for quarantine partitions with no bad record that day
    (an empty partition holds no data file; a tiny surface often has none)."""
    assert changed <= expected, changed - expected
    assert {k for k in expected - changed if k[0] != "events_quarantine"} == set(), expected - changed


def _waves(summary: dict) -> list[set[str]]:
    return [set(w) for w in summary["automation"]]


def _changed(before: dict, after: dict) -> set[tuple[str, str]]:
    return {k for k in after if before.get(k) != after[k]} | (set(before) - set(after))


def _day(table_day: str, predicted_days: list[str]) -> set[tuple[str, str]]:
    """The partitions one new day writes: its four surfaces in each date x surface table, its
    training_examples, and the teacher predictions of `predicted_days`."""
    new = {(t, f"{table_day}|{s}") for t in LAKE[:4] for s in SURFACES} | {("training_examples", table_day)}
    return new | {("teacher_predictions", d) for d in predicted_days}


@pytest.mark.timeout(5400)
def test_three_days_in_the_life(demo_copy: dict[str, str], tmp_path: Path) -> None:
    env = demo_copy
    home = Path(env["GEM_HOME"])
    parts0, acc0 = _partitions(home), _accepted(home)
    students = {f"students/{s}/ACCEPTED" for s in SURFACES}
    domains = {"domain_models/commerce/ACCEPTED", "domain_models/social/ACCEPTED"}
    assert set(acc0) == students | domains | {"foundation_model/ACCEPTED"}

    # day 1: E = 2026-11-07 (a Saturday; today Sunday): no foundation retraining
    day1 = _next_day(env, tmp_path)
    assert day1["today"] == "2026-11-08" and day1["failed"] == [] and day1["not_run"] == []
    assert set(day1["schedule"]) == {f"land_and_ingest_job[2026-11-07|{s}]" for s in SURFACES}
    assert day1["sensor"] == []  # the schedule landed and ingested the files itself: nothing twice
    assert day1["before_landing"] == []
    assert _waves(day1) == [
        {"activity_by_day,training_examples[2026-11-07]"},
        # the teachers did not change: only the new day, served by the foundation refreshed on 11-04
        {"foundation_refresh,teacher_predictions[2026-11-07]"},
        {"distillation_report[]"},
        {f"students[{s}]" for s in SURFACES},
    ]
    parts1, acc1 = _partitions(home), _accepted(home)
    _assert_day(_changed(parts0, parts1), _day("2026-11-07", ["2026-11-07"]))
    refreshed = "foundation_refresh/20261107/ACCEPTED"
    assert {k for k in acc1 if acc1[k] != acc0.get(k)} == students | {refreshed}  # the weekly teachers kept theirs
    _served(home, "2026-11-07", acc1[refreshed], continues=acc0["foundation_model/ACCEPTED"], trained="2026-11-04")
    # the teachers did not change: the demo's selection (on its E-1) stands, the labels_only floor trains
    assert _report_arms(home, "2026-11-05") == ["labels_only"]
    warm = _warm_starts(home, acc0, acc1)

    # day 2: E = 2026-11-08, today Monday: the weekly cadence retrains the foundation model (warm start)
    day2 = _next_day(env, tmp_path)
    assert day2["today"] == "2026-11-09" and day2["failed"] == [] and day2["not_run"] == []
    assert set(day2["schedule"]) == {f"land_and_ingest_job[2026-11-08|{s}]" for s in SURFACES}
    assert day2["sensor"] == []
    assert _waves(day2) == [
        {"activity_by_day,training_examples[2026-11-08]"},
        {"foundation_model[]"},
        {"domain_models[commerce]", "domain_models[social]"},  # domain models follow their teacher
        # every role day, new teachers: first the new day, whose refresh has nothing new to learn (the retrain's
        # window ends where the day's does) so the retrained foundation serves it, then the days before (a run
        # waits while an ancestor asset, here foundation_refresh, is requested in another)
        {"foundation_refresh,teacher_predictions[2026-11-08]"},
        {f"teacher_predictions[2026-11-{d:02d}]" for d in range(3, 8)},
        {"distillation_report[]"},
        {f"students[{s}]" for s in SURFACES},
    ]
    parts2, acc2 = _partitions(home), _accepted(home)
    _assert_day(_changed(parts1, parts2), _day("2026-11-08", [f"2026-11-{d:02d}" for d in range(3, 9)]))
    # every model moved, the teacher included; 11-07's refresh is no longer served (its root is no longer ACCEPTED)
    assert {k for k in acc2 if acc2[k] != acc1[k]} == set(acc2) - {refreshed}
    _served(home, "2026-11-07", acc2["foundation_model/ACCEPTED"])
    _served(home, "2026-11-08", acc2["foundation_model/ACCEPTED"])
    assert _report_arms(home, "2026-11-07") == sorted(DEFAULT_ARMS)  # new teachers: every arm compared on E-1
    warm += _warm_starts(home, acc1, acc2)

    # day 3: E = 2026-11-09, today Tuesday: the new day only, the teachers kept
    day3 = _next_day(env, tmp_path)
    assert day3["today"] == "2026-11-10" and day3["failed"] == [] and day3["not_run"] == []
    assert _waves(day3) == [
        {"activity_by_day,training_examples[2026-11-09]"},
        {"foundation_refresh,teacher_predictions[2026-11-09]"},
        {"distillation_report[]"},
        {f"students[{s}]" for s in SURFACES},
    ]
    parts3, acc3 = _partitions(home), _accepted(home)
    _assert_day(_changed(parts2, parts3), _day("2026-11-09", ["2026-11-09"]))
    assert {k for k in acc3 if acc3[k] != acc2.get(k)} == students | {"foundation_refresh/20261109/ACCEPTED"}
    _served(home, "2026-11-09", acc3["foundation_refresh/20261109/ACCEPTED"],
            continues=acc2["foundation_model/ACCEPTED"], trained="2026-11-06")
    assert _report_arms(home, "2026-11-07") == ["labels_only"]
    assert warm + _warm_starts(home, acc2, acc3) >= 1  # the students refresh by warm start
    assert json.loads((home / "clock.json").read_text()) == {"extra_days": 3}
    # the teacher waits for its cadence: after a day without retraining it is older than the new
    # day's examples, and marked so
    assert "foundation_model[]" in day3["stale"] and "foundation_model[]" not in day2["stale"]

    # every automation run is listed under its job (not the hidden asset job)
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        runs = [r for r in instance.get_runs() if r.tags.get("gem/trigger") == "automation"]
        assert len(runs) == sum(len(w) for d in (day1, day2, day3) for w in d["automation"])
        assert {r.job_name for r in runs} == {"features_job", "foundation_job", "domain_models_job",
                                              "teacher_predictions_job", "distillation_report_job", "students_job"}
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        # every ACCEPTED version, the days' refreshes included, traces to a passing gate in the event log
        assert untraced_accepted(instance, home) == []
        # the report is linked from each student's page
        for s in SURFACES:
            (obs,) = instance.fetch_observations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("students"), asset_partitions=[s]), limit=1).records
            meta = obs.asset_observation.metadata
            assert meta["report_path"].value == "reports/days_in_the_life.md"
            assert meta["days"].value.count(f"| {s} |") == 3
    _check_report(home, [day1, day2, day3], acc1)


def _check_report(home: Path, summaries: list[dict], acc1: dict[str, str]) -> None:
    """One record per day: per surface the foundation's NE against the oracle, the share of the gap
    it closes, its calibration against the truth and its NE on new ads; the models each day retrained
    (warm or cold) and the day's wall time; rendered as a markdown table and a plot."""
    days = [json.loads(p.read_text()) for p in sorted((home / "reports" / "next_day").glob("*.json"))]
    assert [d["day"] for d in days] == ["2026-11-07", "2026-11-08", "2026-11-09"]
    for d, summary in zip(days, summaries, strict=True):
        assert d["wall_s"] == summary["wall_s"] > 0 and d["failed"] == []
        assert {r["surface"] for r in d["surfaces"]} == set(SURFACES)
        assert sum(r["new_ad_impressions"] for r in d["surfaces"]) > 0  # churn: ads born that day are shown
        for r in d["surfaces"]:
            assert r["impressions"] > 0 and 0.2 < r["calibration"] < 5  # mean prediction / mean oracle p
            # the yardstick: the oracle's own p behind a map fitted like the foundation's, on its days
            assert 0.2 < r["oracle_map_calibration"] < 5
            assert r["calibration_ok"] == (abs(r["calibration"] - 1) <= abs(r["oracle_map_calibration"] - 1))
            if r["clicks"] == 0:  # the test world's shops: ~1 click a day, NE undefined without one
                assert math.isnan(r["ne"]) and math.isnan(r["oracle_ne"])
                continue
            assert 0 < r["oracle_ne"] < 1 and math.isfinite(r["ne"])
            assert r["gap_closed"] == pytest.approx((1 - r["ne"]) / (1 - r["oracle_ne"]))
            assert r["new_ad_impressions"] >= 0 and (r["new_ad_clicks"] == 0 or math.isfinite(r["new_ad_ne"]))
            assert r["student_ne"] is not None  # the students retrain every day: gated on this E
    assert {m["model"]: m["start"] for m in days[0]["retrained"] if m["model"].startswith("foundation")} == {
        "foundation_refresh/20261107": "warm"}
    assert {m["model"] for m in days[0]["retrained"]} == {f"students/{s}" for s in SURFACES} | {"foundation_refresh/20261107"}
    second = {m["model"]: m["start"] for m in days[1]["retrained"]}
    assert set(second) == {k.removesuffix("/ACCEPTED") for k in acc1} - {"foundation_refresh/20261107"}  # every model moved
    assert second["foundation_model"] == "warm"  # the weekly retrain warm-starts
    assert all(m["start"] in ("warm", "cold") for m in days[2]["retrained"])
    md = (home / "reports" / "days_in_the_life.md").read_text()
    # a row per day, per day and surface, and per day by ad age
    assert md.count("| 2026-11-0") == 3 + 3 * len(SURFACES) + 3
    ok = sum(r["calibration_ok"] for d in days for r in d["surfaces"])
    assert f"than the oracle's behind the same map: {ok} of {3 * len(SURFACES)} (day, surface) cells" in md
    head = md.split("## Every day's rows pooled")[0]
    for surface in SURFACES:  # per surface: the cells within the yardstick and the model's drift past the map's noise
        rs = [r for d in days for r in d["surfaces"] if r["surface"] == surface]
        line = next(x for x in head.splitlines() if x.startswith(f"| {surface} | ") and " of 3 |" in x).split("|")
        assert line[2].strip() == f"{sum(r['calibration_ok'] for r in rs)} of 3"
        ratio = np.mean([r["calibration"] / r["oracle_map_calibration"] for r in rs])
        assert float(line[5]) == pytest.approx(ratio, abs=1e-4)
    pooled = md.split("## Every day's rows pooled")[1].splitlines()
    by_age = md.split("per day and ad age")[1].splitlines()
    assert [line.split("|")[1].strip() for line in by_age if line.startswith("| 2026-")] == [d["day"] for d in days]
    for surface in SURFACES:  # the three days' rows together, per surface
        cells = next(line for line in pooled if line.startswith(f"| {surface} |")).split("|")[2:5]
        rs = [r for d in days for r in d["surfaces"] if r["surface"] == surface]
        assert [int(c) for c in cells] == [3, sum(r["impressions"] for r in rs), sum(r["clicks"] for r in rs)]
    tables = md.split("## Every day's rows pooled")[1].split("Impressions of ads first seen")
    assert len(tables) == 4  # every row; then by the ad's age: on E, 1-2 days before, earlier
    for table, imps, clicks in ((tables[0], "impressions", "clicks"), (tables[1], "new_ad_impressions", "new_ad_clicks")):
        line = next(x for x in table.splitlines() if x.startswith("| all |")).split("|")
        assert [int(c) for c in line[2:5]] == [3, sum(r[imps] for d in days for r in d["surfaces"]),
                                                sum(r[clicks] for d in days for r in d["surfaces"])]
        if int(line[4]):  # clicks: NE defined, inside its bootstrap interval
            lo, hi = (float(x) for x in line[6].strip(" []").split(","))
            assert lo <= float(line[5]) <= hi and 0.2 < float(line[10]) < 5  # calibration against the truth
    ages = [int(next(x for x in t.splitlines() if x.startswith("| all |")).split("|")[3]) for t in tables]
    assert sum(ages[1:]) == ages[0]  # the three ages share out every impression
    # then by fold status against the window of the foundation that served each day: they share it out too
    from gem_pipelines.day_report import FOLD_TITLES

    assert set(FOLD_TITLES) == set(FOLD_STATUS)
    after = md.split("## Every day's rows pooled")[1]
    folds = [after.split(f"Impressions of ads {FOLD_TITLES[s]}:")[1] for s in FOLD_TITLES
             if f"Impressions of ads {FOLD_TITLES[s]}:" in after]
    assert f"Impressions of ads {FOLD_TITLES['known']}:" in after  # most of E's ads outlive a day's churn
    assert sum(int(next(x for x in t.splitlines() if x.startswith("| all |")).split("|")[3]) for t in folds) == ages[0]
    assert (home / "reports" / "days_in_the_life.png").read_bytes()[:4] == b"\x89PNG"
