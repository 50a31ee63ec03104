"""Where validation time goes on one partition: each suite, the Data Docs pages, and a sample; GX's fixed
cost (the same on 1-row frames); and the events suite split over GX's phases.

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
        one = {t: f.head(1) for t, f in frames.items() if f.height}
        ones = {t: V.validate_frame(t, f, partition_key=key, build=False) for t, f in one.items()}
        fixed = sum(best(lambda t=t, f=f: V.validate_frame(t, f, partition_key=key, build=False)) for t, f in one.items())
        fixed += best(lambda: V.build_docs(list(ones.values())))
        print(f"the same on 1-row frames (GX fixed cost)  {fixed:6.3f} s")
        phases(V, frames["events"], key)


def phases(V, frame, key: str, runs: int = 10) -> None:  # noqa: N803 (the module, as above)
    """Mean milliseconds per events-suite run in GX's main phases (nested: a phase includes those below it)."""
    import collections
    import time

    import great_expectations.expectations.expectation as E
    import great_expectations.validator.validator as OV

    from gem_model.store import atomic

    spent: dict[str, float] = collections.defaultdict(float)
    patched = [(V, "validate_frame", "validate_frame"), (V, "_to_pandas", "  polars -> pandas"),
               (V, "_run_suite", "  suite through the Validator (one pass)"),
               (OV.Validator, "_resolve_suite_level_graph_and_process_metric_evaluation_errors",
                "    metric resolution (pandas engine)"),
               (E.Expectation, "metrics_validate", "    expectations checking their metrics"),
               (atomic, "write_json", "  result stored (JSON)")]
    originals = [(obj, name, getattr(obj, name)) for obj, name, _ in patched]

    def timed(fn, label):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t
        return run

    for obj, name, label in patched:
        setattr(obj, name, timed(getattr(obj, name), label))
    try:
        for _ in range(runs):
            V.validate_frame("events", frame, partition_key=key, build=False)
    finally:
        for obj, name, fn in originals:
            setattr(obj, name, fn)
    print(f"events suite, {frame.height} rows, mean ms per run:")
    for label in dict.fromkeys(label for *_, label in patched):
        print(f"  {label:<42} {1000 * spent[label] / runs:7.1f}")


if __name__ == "__main__":
    main()
