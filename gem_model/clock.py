"""The simulator's clock: how many days `make next-day` has added to the calendar window.

State, not config: it lives in $GEM_HOME/clock.json, so assets/calendar.yaml stays as written and
`make clean` resets the world. Every day role (warm-up, teacher, students, validation, evaluation
E) derives from the window's last day, so extending the window moves them all with E.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def clock_path() -> Path:
    from gem_model.paths import gem_home

    return gem_home() / "clock.json"


def extra_days() -> int:
    """Days added to a fixed window since `make demo` (0 before the first `make next-day`)."""
    path = clock_path()
    if not path.exists():
        return 0
    value = json.loads(path.read_text()).get("extra_days", 0)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: extra_days must be a non-negative integer, got {value!r}")
    return value


def advance(days: int = 1) -> int:
    """Add `days` to the window (atomically: a reader never sees a half-written file); returns the total."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    path = clock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    total = extra_days() + days
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".clock.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"extra_days": total}, f)
    os.replace(tmp, path)
    return total
