"""Which foundation version serves a day (gem_pipelines.assets.refresh.serving_foundation): the day's ACCEPTED
refresh while it continues the ACCEPTED foundation; the ACCEPTED foundation itself otherwise (no refresh that day,
a refresh the gate refused, or one continuing a foundation a retrain has since replaced)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from gem_model.models.registry import write_accepted
from gem_model.train.refresh import refresh_partition

DAY = dt.date(2026, 11, 7)
V1, V2, V3, R1 = (f"2026120{i}T000000Z-abc123" for i in (1, 2, 3, 4))


def _version(home: Path, asset: str, version: str, partition: str | None = None, root: str | None = None) -> Path:
    vdir = home / "models" / asset / (partition or "") / version
    vdir.mkdir(parents=True)
    if root is not None:
        (vdir / "refresh.json").write_text(json.dumps({"root": root, "init": root, "day": partition,
                                                       "train_days": [partition, partition]}))
    return vdir


def test_a_day_is_served_by_its_refresh_while_the_refresh_continues_the_accepted_foundation(gem_home: Path):
    from gem_pipelines.assets.refresh import serving_foundation

    assert serving_foundation(DAY) is None  # nothing ACCEPTED yet
    v1 = _version(gem_home, "foundation_model", V1)
    write_accepted("foundation_model", V1)
    assert serving_foundation(DAY) == (v1, V1)  # no refresh for the day

    day = refresh_partition(DAY)
    assert day == "20261107"  # a name on disk: [a-z0-9_]+
    r1 = _version(gem_home, "foundation_refresh", R1, day, root=V1)
    assert serving_foundation(DAY) == (v1, V1)  # written but not (yet) let through by its gate
    write_accepted("foundation_refresh", R1, day)
    assert serving_foundation(DAY) == (r1, V1)
    assert serving_foundation(DAY - dt.timedelta(days=1)) == (v1, V1)  # another day: its own, here none

    v2 = _version(gem_home, "foundation_model", V2)
    write_accepted("foundation_model", V2)  # the weekly retrain replaced the refresh's root
    assert serving_foundation(DAY) == (v2, V2)

    # a version ACCEPTED under the refresh's name that records no root is not served
    _version(gem_home, "foundation_refresh", V3, day)
    write_accepted("foundation_refresh", V3, day)
    assert serving_foundation(DAY) == (v2, V2)
