"""The simulator's clock: how many days `make next-day` has added to the calendar window.

State, not config: it lives in $GEM_HOME/clock.json, so assets/calendar.yaml stays as written and
`make clean` resets the world. `gem_model.config.extra_days` reads it; this module advances it.
"""

from __future__ import annotations

from gem_model.config import clock_path, extra_days
from gem_model.store import atomic


def advance(days: int = 1) -> int:
    """Add `days` to the window; returns the total."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    total = extra_days() + days
    atomic.write_json(clock_path(), {"extra_days": total})
    return total
