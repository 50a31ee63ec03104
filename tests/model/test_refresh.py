"""The daily refresh (gem_model.train.refresh): a foundation version continued on the days that entered a later
day's teacher window since its own, written where the pipeline asset keeps it, with a record of the chain's root;
nothing to do once a version trained through the day's window."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gem_model.config import CalendarConfig

D = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(6)]
TINY = {"train": {"torch_threads": 1, "max_steps": 3}}


def test_calendar_for_a_day_gives_that_days_roles():
    from gem_model.train.refresh import calendar_for

    cal = CalendarConfig(start=D[0], days=6, teacher_lag_days=1)
    roles = calendar_for(D[4], cal).roles()
    assert (roles.evaluation, roles.validation, roles.teacher) == (D[4], D[3], (D[1], D[1]))
    assert calendar_for(D[5] + dt.timedelta(days=3), cal).roles().teacher[1] == D[5]  # past the window: it grows
    with pytest.raises(ValueError, match="before the calendar's start"):
        calendar_for(D[0] - dt.timedelta(days=1), cal)


def test_a_refresh_continues_a_version_on_the_new_teacher_day_and_records_its_root(gem_home: Path, tmp_path: Path):
    from gem_model.models.registry import load_model
    from gem_model.train.foundation import run_foundation
    from gem_model.train.refresh import (
        REFRESH_ASSET,
        calendar_for,
        days_to_refresh,
        foundation_version_dir,
        read_refresh,
        refresh_foundation,
        refresh_partition,
    )
    from tests.model.test_warm_retrain import _two_window_lake

    lake = tmp_path / "lake"
    _two_window_lake(lake, D, born=D[3], rows=1500)
    cal = CalendarConfig(start=D[0], days=6, teacher_lag_days=1)
    common = {"out_root": gem_home, "device": "cpu", "lake": str(lake), "overrides": TINY}
    # the weekly foundation as of E = D[4]: its window ends at D[1]
    init = Path(run_foundation("tiny", calendar=calendar_for(D[4], cal), baselines=False, **common)["version_dir"])
    assert days_to_refresh(init, D[4], cal) is None  # it trained through D[4]'s window: nothing to refresh
    todo = days_to_refresh(init, D[5], cal)
    assert todo == (D[2].isoformat(), D[2].isoformat())  # the one day that entered D[5]'s window

    result = refresh_foundation(init, D[5], todo, root=init.name, calendar=cal, asset=REFRESH_ASSET,
                                partition=refresh_partition(D[5]), **common)
    vdir = Path(result["version_dir"])
    assert vdir.parent == gem_home / "models" / REFRESH_ASSET / "20261106"
    assert read_refresh(vdir) == {"root": init.name, "init": init.name, "day": D[5].isoformat(),
                                  "train_days": [D[2].isoformat()] * 2}
    _, config = load_model(vdir)
    assert config["data"]["train"] == [D[2].isoformat()] * 2  # the new day alone, not the window again
    assert (config["data"]["valid"], config["data"]["eval"]) == (D[4].isoformat(), D[5].isoformat())
    assert config["train"]["epochs"] == 1 and config["train"]["max_steps"] == 3
    metrics = json.loads((vdir / "metrics.json").read_text())
    assert metrics["warm_start"]["loaded"] > 0  # continued, not trained anew
    assert {r["model"] for r in result["rows"]} == {"foundation"}  # no single-surface baselines
    assert days_to_refresh(vdir, D[5], cal) is None  # the refreshed version covers D[5]'s window

    # a version is found by its name, wherever it lives; a version that is no refresh has no record
    assert foundation_version_dir(vdir.name) == vdir and foundation_version_dir(init.name) == init
    assert foundation_version_dir("20260101T000000Z-nosuch") is None and read_refresh(init) is None
    with pytest.raises(ValueError, match="is not <UTC time>-<run id>"):  # a table's teacher_version, checked first
        foundation_version_dir("../../etc")


def test_the_refresh_is_on_where_the_preset_sets_its_epochs():
    from gem_model.train.refresh import refresh_epochs

    assert refresh_epochs("small") == 1 and refresh_epochs("tiny") == 1  # the simulated worlds and the tests'
    assert refresh_epochs("base") is None  # unset: the weekly retrain alone
