"""Where validation time goes on one partition: each suite, the Data Docs pages, and a sample.

    python bench/validation_cost.py [surface]

Prints seconds per step (best of 3, after a warm-up that pays the GX import and context set-up).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import best_of as best  # noqa: E402  (bench/ingest.py: same best-of-3 timing)


def main() -> None:
    surface = sys.argv[1] if len(sys.argv) > 1 else "feed"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GEM_HOME"] = tmp
        from gem_model.config import load_simulator, load_surfaces
        from gem_pipelines.data import validation as V
        from gem_pipelines.data.normalize import normalize_partition
        from gem_pipelines.data.parsers import stage_partition
        from gem_pipelines.data.simulator import simulate_partition

        surfaces, date, landing = load_surfaces(), dt.date(2026, 11, 2), Path(tmp) / "landing"
        s = surfaces.get(surface)
        simulate_partition(load_simulator(), surfaces, surface, date, landing)
        norm = normalize_partition(stage_partition(s.format, landing / surface / date.isoformat()), s, date)
        frames = {"events": norm.events, "user_activity": norm.user_activity, "events_quarantine": norm.quarantine}
        key = f"{date}|{surface}"
        results = {t: V.validate_frame(t, f, partition_key=key, build=False) for t, f in frames.items()}  # warm-up
        for table, frame in frames.items():
            sec = best(lambda t=table, f=frame: V.validate_frame(t, f, partition_key=key, build=False))
            print(f"suite {table:<18} {frame.height:>7} rows  {sec:6.3f} s")
        sample = best(lambda: V.validate_frame("events", frames["events"], partition_key=key, build=False,
                                               max_rows=2000))
        print(f"suite events (2,000-row sample)         {sample:6.3f} s")
        print(f"Data Docs pages + index of one run      {best(lambda: V.build_docs(list(results.values()))):6.3f} s")


if __name__ == "__main__":
    main()
