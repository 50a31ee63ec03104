"""Ingest throughput for one partition per surface, side by side with the floor.

ours      : parse (stage) + row-level rules + three Delta commits        (what the asset does minus GX)
ours + GX : the same plus the Great Expectations suites on the whole partition
GX detail : ours + GX with every expectation computed in GX's SUMMARY format (issue 10's "before": the suites
            now run in BOOLEAN_ONLY and re-run only failed and observed-value expectations in SUMMARY)
floor     : polars reads the same raw files (no validation) + one plain write_parquet of the
            normalised rows

Prints rows/s and the ratio ours/floor (goal: >= 0.5). Run: python bench/ingest.py
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import tempfile
import time
from pathlib import Path

import polars as pl


def clean_copy(directory: Path, out: Path) -> Path:
    """The floor reads files with the corrupt JSON lines removed (polars cannot skip them itself)."""
    dest = out / directory.parent.name
    dest.mkdir(exist_ok=True)
    for path in directory.iterdir():
        data = path.read_bytes()
        if path.suffix == ".jsonl":
            lines = pl.Series(data.decode().splitlines())
            ok = lines.str.json_path_match("$").is_not_null() & lines.str.starts_with("{")
            data = ("\n".join(lines.filter(ok).to_list()) + "\n").encode()
        (dest / path.name).write_bytes(data)
    return dest


def floor(fmt: str, directory: Path, out: Path, normalized: pl.DataFrame) -> None:
    for path in sorted(directory.iterdir()):
        if path.suffix == ".parquet":
            pl.read_parquet(path)
        elif path.suffix == ".csv":
            pl.read_csv(path, infer_schema=False, truncate_ragged_lines=True)
        else:
            pl.read_ndjson(path, infer_schema_length=None)
    normalized.write_parquet(out / f"{fmt}.parquet")


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GEM_HOME"] = tmp
        from gem_model.config import load_simulator, load_surfaces
        from gem_pipelines.data import validation
        from gem_pipelines.data.ingest import ingest_partition
        from gem_pipelines.data.normalize import normalize_partition
        from gem_pipelines.data.parsers import stage_partition
        from gem_pipelines.data.simulator import simulate_partition

        surfaces, cfg = load_surfaces(), load_simulator()
        date = dt.date(2026, 11, 2)
        landing = Path(tmp) / "landing"
        out = Path(tmp) / "floor"
        out.mkdir()
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
        print(f"{'surface':<12} {'format':<13} {'records':>8} {'floor r/s':>11} {'ours r/s':>10} "
              f"{'ours+GX r/s':>12} {'ours/floor':>10} {'(ours+GX)/floor':>16} {'(GX detail)/floor':>18}")
        # warm up GX import and the world cache outside the timings
        simulate_partition(cfg, surfaces, surfaces.surfaces[0].name, date, landing)
        ingest_partition(surfaces.surfaces[0], date, landing, validate=True)
        totals = {"n": 0, "floor": 0.0, "ours": 0.0, "gx": 0.0, "detail": 0.0}
        fast = validation.PASS_FORMAT

        def detail(s) -> None:  # every expectation in SUMMARY, as before the BOOLEAN_ONLY pass
            validation.PASS_FORMAT = validation.DETAIL_FORMAT
            try:
                ingest_partition(s, date, landing, validate=True)
            finally:
                validation.PASS_FORMAT = fast

        for s in surfaces.surfaces:
            simulate_partition(cfg, surfaces, s.name, date, landing)
            d = landing / s.name / date.isoformat()
            norm = normalize_partition(stage_partition(s.format, d), s, date)
            n = norm.raw_records
            normalized = pl.concat([norm.events, norm.organic], how="diagonal_relaxed")
            clean = clean_copy(d, out)
            t_floor = best_of(lambda s=s, clean=clean, normalized=normalized: floor(s.format, clean, out, normalized))
            t_ours = best_of(lambda s=s: ingest_partition(s, date, landing, validate=False))
            t_gx = best_of(lambda s=s: ingest_partition(s, date, landing, validate=True), repeat=2)
            t_detail = best_of(lambda s=s: detail(s), repeat=2)
            print(f"{s.name:<12} {s.format:<13} {n:>8} {n / t_floor:>11,.0f} {n / t_ours:>10,.0f} "
                  f"{n / t_gx:>12,.0f} {t_floor / t_ours:>10.2f} {t_floor / t_gx:>16.2f} {t_floor / t_detail:>18.2f}")
            for k, v in (("n", n), ("floor", t_floor), ("ours", t_ours), ("gx", t_gx), ("detail", t_detail)):
                totals[k] += v
        n, f, o, g, d = totals["n"], totals["floor"], totals["ours"], totals["gx"], totals["detail"]
        print(f"{'whole day':<12} {'all':<13} {n:>8} {n / f:>11,.0f} {n / o:>10,.0f} {n / g:>12,.0f} "
              f"{f / o:>10.2f} {f / g:>16.2f} {f / d:>18.2f}")


if __name__ == "__main__":
    main()
