"""The served foundation against a logistic regression on impressions of ads first seen on E (issue 24).

    PYTHONPATH=. GEM_HOME=<home> python bench/new_ads_vs_lr.py [--days 2026-11-08 ...] [--n-boot 1000] [--reuse]
    PYTHONPATH=. GEM_HOME=<home> python bench/new_ads_vs_lr.py --served <dir of bench/serving_fold_in.py --save>

Needs a home where `make next-day` / `make week` scored the days (`teacher_predictions` of teacher
`foundation` on each E: what the pipeline served). Default day: the first of `reports/next_day/`, the
weekly retrain's day, where the served foundation was trained on exactly the teacher's window of E.
For each day E, gem_model.eval.baselines' logistic regression is trained on that same window (the
calendar's roles for E; validation E-1) and both models' predictions of E are paired on the impressions
of ads first seen on E (gem_model.eval.ad_age, from the logs). With several days the rows are pooled.
One Poisson bootstrap over the rows gives every interval (the difference's is paired). Prints a
table, never pass/fail; writes it with its JSON under $GEM_HOME/bench/new_ads_vs_lr/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]  # bench/kernels.py would shadow the package
sys.path.insert(0, str(_HERE.parent))

import polars as pl  # noqa: E402

from gem_model.config import load_calendar  # noqa: E402
from gem_model.eval.ad_age import EVAL_PREDICTIONS, ad_ages, read_events  # noqa: E402
from gem_model.eval.baselines import run_baselines  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy, paired_difference  # noqa: E402
from gem_model.store.paths import gem_home, reports_dir, storage_options, table_uri  # noqa: E402

LR = "logistic_regression"


def lr_predictions(day: dt.date, out: Path, seed: int, reuse: bool) -> pl.DataFrame:
    """The logistic regression's predictions of `day`, trained on the teacher's window of `day`."""
    path = out / day.isoformat() / f"seed{seed}" / LR / EVAL_PREDICTIONS  # --reuse never reads another seed's
    if not (reuse and path.is_file()):
        cal = load_calendar()
        roles = cal.model_copy(update={"days": (day - cal.start).days + 1}).roles()
        train = pl.date_range(roles.teacher[0], roles.teacher[1], eager=True)
        uri = table_uri("training_examples")
        run_baselines([str(d) for d in train], str(roles.validation), str(day), path.parents[1], uri=uri,
                      seed=seed, storage_options=storage_options(uri))
    return pl.read_parquet(path).select("request_id", "surface", "click", pl.col("p_click").alias(LR))


def served(day: dt.date) -> pl.DataFrame:
    """request_id, foundation: what the pipeline served on `day` (teacher_predictions)."""
    uri = table_uri("teacher_predictions")
    return (pl.scan_delta(uri, storage_options=storage_options(uri))
            .filter((pl.col("date") == day) & (pl.col("teacher") == "foundation"))
            .select("request_id", pl.col("p_click").alias("foundation")).collect())


def compare(rows: pl.DataFrame, n_boot: int) -> dict[str, object]:
    y = rows["click"].cast(pl.Float64).to_numpy()
    preds = {m: rows[m].to_numpy() for m in ("foundation", LR)}
    out: dict[str, object] = {"impressions": rows.height, "clicks": int(y.sum())}
    if y.sum() == 0:
        return out
    boot = bootstrap_ne(y, preds, n_boot=n_boot, chunk=20)
    point = {m: normalized_entropy(y, p) for m, p in preds.items()}
    for m in preds:
        out[m] = {"ne": point[m], "ci": list(interval(boot[m]))}
    out["diff"] = paired_difference(boot["foundation"], boot[LR], point["foundation"] - point[LR])
    return out


def markdown(result: dict[str, object]) -> str:
    lines = [f"Days (E): {', '.join(result['days'])}. Foundation: as served (`teacher_predictions`, or `--served`); logistic regression: "
             "trained on the teacher's window of each E.", ""]
    for age, title in (("new", "Impressions of ads first seen on E"), ("all", "Every impression")):
        lines += [f"**{title}**", "", "| surface | impressions | clicks | foundation NE [95%] | LR NE [95%] | "
                  "foundation - LR [95%] | verdict |", "|---|---|---|---|---|---|---|"]
        for surface, r in result[age].items():
            if "diff" not in r:
                lines.append(f"| {surface} | {r['impressions']} | {r['clicks']} | | | | no clicks |")
                continue
            f, g, d = r["foundation"], r[LR], r["diff"]
            lines.append(f"| {surface} | {r['impressions']} | {r['clicks']} | {f['ne']:.4f} [{f['ci'][0]:.4f}, {f['ci'][1]:.4f}] | "
                         f"{g['ne']:.4f} [{g['ci'][0]:.4f}, {g['ci'][1]:.4f}] | {d['diff']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] | "
                         f"{d['verdict'].replace('a better', 'foundation better').replace('b better', 'LR better')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", nargs="+", type=dt.date.fromisoformat, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--reuse", action="store_true", help="read a day's logistic regression from a previous run")
    p.add_argument("--served", type=Path, default=None,
                   help="the foundation's predictions of the one day from DIR/eval_predictions.parquet (what "
                        "bench/serving_fold_in.py --save writes) instead of teacher_predictions")
    a = p.parse_args(argv)
    recorded = sorted((reports_dir() / "next_day").glob("*.json"))
    days = a.days or ([dt.date.fromisoformat(recorded[0].stem)] if recorded and a.served is None
                      else [load_calendar().roles().evaluation])
    if a.served is not None and len(days) != 1:
        p.error("--served holds one day's predictions: give one day")
    out = gem_home() / "bench" / "new_ads_vs_lr"
    frames = []
    for day in days:
        foundation = (served(day) if a.served is None else pl.read_parquet(a.served / EVAL_PREDICTIONS)
                      .select("request_id", pl.col("p_click").alias("foundation")))
        rows = lr_predictions(day, out, a.seed, a.reuse).join(foundation, on="request_id", how="inner")
        if rows.height == 0:
            p.error(f"{day}: no served foundation predictions (run `make next-day` through this day first)")
        frames.append(rows.join(ad_ages(read_events(day), day), on="request_id", how="left"))
    rows = pl.concat(frames)
    result: dict[str, object] = {"days": [d.isoformat() for d in days], "seed": a.seed, "n_boot": a.n_boot}
    for age, sub in (("new", rows.filter(pl.col("ad_age") == "new")), ("all", rows)):
        surfaces = sorted(sub["surface"].unique().to_list())
        result[age] = {s: compare(sub.filter(pl.col("surface") == s), a.n_boot) for s in surfaces}
        result[age]["all"] = compare(sub, a.n_boot)
    table = markdown(result)
    (out / "new_ads_vs_lr.json").write_text(json.dumps(result, indent=1))
    (out / "new_ads_vs_lr.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
