"""A daily refresh of the foundation: the version that served the day before, continued on the days that have
entered the teacher window since its own, at the warm-start rates (train.warm_lr_frac) for `train.refresh_epochs`
epochs, selected on the day's E-1 like any foundation (the start kept unless a step beats it). The weekly retrain
replaces the chain: a refresh records the ACCEPTED foundation it continues (its root), and a chain whose root is no
longer ACCEPTED serves nothing. The evaluation world's week, one seed (bench/RESULTS.md, "A daily refresh chained
over the week of `dfab6bc`"): refreshed - stale pooled -0.0029 [-0.0043, -0.0015], calibration 1.014 -> 1.010.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from gem_model.config import CalendarConfig, load_calendar
from gem_model.models.registry import version_dir
from gem_model.store import atomic
from gem_model.store.paths import models_dir

REFRESH_ASSET = "foundation_refresh"  # its versions: models/foundation_refresh/<YYYYMMDD>/<version>
REFRESH_FILE = "refresh.json"  # beside a refreshed version: {root, init, day, train_days}


def refresh_partition(day: dt.date) -> str:
    """The directory of `day`'s refresh under models/foundation_refresh/ (names on disk are [a-z0-9_]+)."""
    return day.strftime("%Y%m%d")


def calendar_for(day: dt.date, calendar: CalendarConfig | None = None) -> CalendarConfig:
    """The calendar whose E is `day`: the window cut at `day`, so every role (teacher window, E-1) is `day`'s."""
    base = calendar or load_calendar()
    if day < base.start:
        raise ValueError(f"{day} is before the calendar's start {base.start}")
    return base.model_copy(update={"days": (day - base.start).days + 1})


def version_config(version_dir: str | Path) -> dict[str, Any]:
    """A foundation version's run config (its config.json, written beside the checkpoint): no weights loaded."""
    return json.loads((Path(version_dir) / "config.json").read_text())


def trained_through(version_dir: str | Path) -> dt.date | None:
    """The last day a foundation version trained on (its config's data.train), None where it records none."""
    window = (version_config(version_dir).get("data") or {}).get("train")
    return dt.date.fromisoformat(str(window[-1])) if window else None


def days_to_refresh(init_dir: str | Path, day: dt.date, calendar: CalendarConfig | None = None) -> tuple[str, str] | None:
    """(first, last) ISO days that entered `day`'s teacher window after `init_dir`'s own window; None when
    nothing new did (the version already trained through the window's last day)."""
    window = calendar_for(day, calendar).roles().teacher
    through = trained_through(init_dir)
    first = through + dt.timedelta(days=1) if through else window[0]
    return (first.isoformat(), window[1].isoformat()) if first <= window[1] else None


def foundation_version_dir(version: str) -> Path | None:
    """A foundation version's directory by name: a retrain's (models/foundation_model/) or a refresh's
    (models/foundation_refresh/<YYYYMMDD>/); None when neither holds it. The name (read from a table's
    teacher_version) is checked before it touches a path."""
    from gem_model.train.foundation import FOUNDATION_ASSET

    if (direct := version_dir(FOUNDATION_ASSET, version)).is_dir():
        return direct
    return next((p for p in sorted(models_dir(REFRESH_ASSET).glob(f"*/{version}")) if p.is_dir()), None)


def refresh_epochs(preset: str) -> int | None:
    """The preset's `train.refresh_epochs` as its file sets it now (None: no daily refresh)."""
    from gem_model.train.config import load_preset

    return load_preset(preset)["train"].get("refresh_epochs")


def read_refresh(version_dir: str | Path) -> dict[str, Any] | None:
    """A refreshed version's record ({root, init, day, train_days}); None for a version that is no refresh."""
    path = Path(version_dir) / REFRESH_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def refresh_foundation(init_dir: str | Path, day: dt.date, train_days: tuple[str, str], *, root: str,
                       epochs: int = 1, calendar: CalendarConfig | None = None, **run_args: Any) -> dict[str, Any]:
    """Continue `init_dir` on `train_days` for E = `day` (run_foundation with `day`'s calendar, no baselines);
    `root`: the ACCEPTED foundation version the chain continues. `run_args` go to run_foundation (out_root, asset,
    partition, version, device, lake, overrides: a "train" override adds to the epochs one). Returns its result."""
    from gem_model.train.foundation import run_foundation

    overrides = dict(run_args.pop("overrides", None) or {})
    overrides["train"] = {"epochs": epochs, **(overrides.get("train") or {})}
    result = run_foundation(version_config(init_dir)["preset"], calendar=calendar_for(day, calendar), init_from=init_dir,
                            baselines=False, train_days=train_days, overrides=overrides, **run_args)
    atomic.write_json(Path(result["version_dir"]) / REFRESH_FILE,
                      {"root": root, "init": Path(init_dir).name, "day": day.isoformat(), "train_days": list(train_days)})
    return result
