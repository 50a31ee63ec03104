"""teacher_predictions' partitions with and without the kept refit (gem_model.distill.refit_cache), side by side.

Each day is served as its `teacher_predictions` partition serves it, once with no cache and once with a cache
that the earlier days of this run filled (a fresh temporary one: the version dir is left alone). Prints each
day's seconds both ways, their ratio, and the largest difference of p_click between the two.

    GEM_DATA=kuairand GEM_HOME=<home> python bench/teacher_refits.py --model <version dir> \\
        --days 2022-04-26 2022-04-27 2022-04-28 [--teacher domain:feed]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]  # bench/kernels.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import load_surfaces  # noqa: E402
from gem_model.distill.teacher import FOUNDATION, predict_teacher  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="the teacher's version dir (holds model.pt)")
    p.add_argument("--days", nargs="+", required=True)
    p.add_argument("--teacher", default=FOUNDATION, help="foundation | domain:<name>")
    a = p.parse_args(argv)
    model, config = load_model(a.model / "model.pt")
    surfaces = None
    if a.teacher != FOUNDATION:
        surfaces = [s.name for s in load_surfaces().in_domain(a.teacher.split(":", 1)[1])]
    uri = table_uri("training_examples")

    def serve(day: dt.date, cache: Path | None) -> tuple[float, pl.DataFrame]:
        t = time.perf_counter()
        df = predict_teacher(model, [day], a.teacher, a.model.name, surfaces=surfaces, uri=uri, recalibrate=True,
                             fold_in=config, refit_cache=cache)
        return time.perf_counter() - t, df.select("request_id", "p_click").sort("request_id")

    print(f"{a.teacher} {a.model.name}: seconds per partition, no cache / kept refit\n")
    print("| day | rows | no cache (s) | kept refit (s) | ratio | max abs p_click diff |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        for day in sorted(dt.date.fromisoformat(d) for d in a.days):
            plain_s, plain = serve(day, None)
            kept_s, kept = serve(day, Path(cache))
            diff = float((plain["p_click"] - kept["p_click"]).abs().max() or 0.0)
            print(f"| {day} | {plain.height:,} | {plain_s:.1f} | {kept_s:.1f} | {kept_s / plain_s:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
