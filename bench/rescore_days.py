"""Re-score finished simulated days with this code, without retraining: each day's foundation rows of
`teacher_predictions` are written again as the asset writes them today (the version that served the day,
predict_teacher with its map re-fitted and the serving-time fold-in), then the days' report
(`reports/days_in_the_life.md`, gem_pipelines.day_report) is re-rendered from them.

    GEM_SIMULATOR=eval GEM_HOME=<a copy of a finished week's home> python bench/rescore_days.py --days <D> [<D> ...]
        [--serve-slices K] [--relevel-surfaces yes|no] [--fold-lookback-days L] [--fit-fold-like-served yes|no]

It rewrites the home it is given: run it on a copy. What changes in the report: every column computed
from the foundation's predictions (NE, gap closed, calibration and its yardstick, new-ad NE, the pooled
tables). What stays as recorded: the student columns (their gates judged them on the day, against the
predictions of then), the retrained models and the wall times. Domain teachers' rows are not touched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.distill.serving_fold_in import with_serving  # noqa: E402
from gem_model.distill.teacher import (  # noqa: E402
    FOUNDATION,
    predict_teacher,
    read_teacher_predictions,
    write_teacher_predictions,
)
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.atomic import write_json  # noqa: E402
from gem_model.store.paths import reports_dir, table_uri  # noqa: E402
from gem_model.train.refresh import foundation_version_dir  # noqa: E402
from gem_pipelines import day_report  # noqa: E402

KEPT = ("student_ne", "student_gap_closed")  # judged on the day by the students' gates


def rescore(day: dt.date, **options: object) -> str:
    """`day`'s foundation rows written again; options: `train.item_svd` serving options to serve it with, as if
    its model had been trained with them (None: the model's own)."""
    versions = read_teacher_predictions([day], [FOUNDATION], embeddings=False)["teacher_version"].unique().to_list()
    if len(versions) != 1:
        raise SystemExit(f"{day}: {len(versions)} foundation versions in teacher_predictions")
    vdir = foundation_version_dir(versions[0])  # a weekly retrain's or a day's refresh
    if vdir is None:
        raise SystemExit(f"{day}: foundation version {versions[0]} is in no models/ folder of this home")
    model, config = load_model(vdir / "model.pt")
    config = with_serving(config, **{k: v for k, v in options.items() if v is not None})
    t0 = time.perf_counter()
    df = predict_teacher(model, [day], FOUNDATION, versions[0], uri=table_uri("training_examples"), recalibrate=True,
                         fold_in=config)
    write_teacher_predictions(df, uri=table_uri("teacher_predictions"))
    return f"{day}: {versions[0]} (window ..{config['data']['train'][-1]}), {df.height} rows, {time.perf_counter() - t0:.0f} s"


def refresh_record(day: dt.date) -> None:
    """The day's record with its foundation columns computed again, the students' kept."""
    path = reports_dir() / day_report.DAYS_DIR / f"{day.isoformat()}.json"
    record = json.loads(path.read_text())
    before = {r["surface"]: r for r in record["surfaces"]}
    rows = day_report.surface_rows(day)
    for row in rows:
        row.update({k: before.get(row["surface"], {}).get(k) for k in KEPT})
    record["surfaces"] = rows
    write_json(path, record)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", required=True, nargs="+", help="recorded days (reports/next_day/<D>.json)")
    p.add_argument("--serve-slices", type=int, default=None,
                   help="train.item_svd.serve_slices (default: each model's own)")
    p.add_argument("--relevel-surfaces", choices=["yes", "no"], default=None,
                   help="train.item_svd.relevel_surfaces (default: each model's own)")
    p.add_argument("--fold-lookback-days", type=int, default=None,
                   help="train.item_svd.fold_lookback_days (default: each model's own)")
    p.add_argument("--fit-fold-like-served", choices=["yes", "no"], default=None,
                   help="train.item_svd.fit_fold_like_served (default: each model's own)")
    a = p.parse_args(argv)
    like = None if a.fit_fold_like_served is None else a.fit_fold_like_served == "yes"
    for d in sorted({dt.date.fromisoformat(x) for x in a.days}):
        relevel = None if a.relevel_surfaces is None else a.relevel_surfaces == "yes"
        print(rescore(d, serve_slices=a.serve_slices, relevel_surfaces=relevel,
                      fold_lookback_days=a.fold_lookback_days, fit_fold_like_served=like), flush=True)
        refresh_record(d)
    out = day_report.render()
    judged = [r["calibration_ok"] for d in day_report.load_days() for r in d["surfaces"]
              if r.get("calibration_ok") is not None]
    print(f"{out}: calibration no further from 1 than the oracle's behind the same map on {sum(judged)} of "
          f"{len(judged)} (day, surface) cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
