"""The simulator's clock: how many days `make next-day` has added to the calendar window.

State, not config: it lives in $GEM_HOME/clock.json, so assets/calendar.yaml stays as written and
`make clean` resets the world. Every day role (warm-up, teacher, students, validation, evaluation
E) derives from the window's last day, so extending the window moves them all with E.
`gem_model.config` reads it (`extra_days`) when it loads the calendar; this module advances it.
"""

from __future__ import annotations

from gem_model.config import clock_path, extra_days
from gem_model.store import atomic


def advance(days: int = 1) -> int:
    """Add `days` to the window (atomically: a reader never sees a half-written file); returns the total."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    total = extra_days() + days
    atomic.write_json(clock_path(), {"extra_days": total})
    return total
