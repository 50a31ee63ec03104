"""Serving-time fold-in: a model scores day D with the ids born after its training window given their
co-occurrence direction first (gem_model.train.item_svd.fold_in_item_svd over the logs of the days between
its window and D, no labels, nothing of D itself). Prints click NE on D with and without, per surface and
by the ad's age (gem_model.eval.ad_age), with paired 95% intervals. One trained model; nothing is trained.

    GEM_SIMULATOR=eval GEM_HOME=<a finished demo> python bench/serving_fold_in.py --model <version dir> --day <D>

Why: with churn most of E's impressions are of ads the teacher never saw (its window ends at E-3), so their
item rows and topic vectors are empty. Choose on E-1 (--day E-1), report on E.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.data.loader import ExampleStream  # noqa: E402
from gem_model.eval.ad_age import AGE_BUCKETS, ALL, ad_ages, read_events  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy, predict  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402
from gem_model.train.item_svd import MAX_ROWS, fold_in_item_svd  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a foundation version dir (model.pt)")
    p.add_argument("--day", required=True, help="the day D to score (choose on E-1)")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--topic-only", action="store_true", help="fold into the frozen topic buffer alone, not the id rows")
    a = p.parse_args(argv)
    model, cfg = load_model(Path(a.model) / "model.pt")
    day = dt.date.fromisoformat(a.day)
    first = dt.date.fromisoformat(cfg["data"]["train"][1]) + dt.timedelta(days=1)
    if first >= day:
        p.error(f"--day {day} is inside or next to the model's window (ends {first - dt.timedelta(days=1)}): nothing to fold")
    uri, surfaces = table_uri("training_examples"), list(model.cfg.surfaces)

    def stream(start: dt.date, end: dt.date) -> ExampleStream:
        return ExampleStream(start, end, surfaces, batch_size=2048, shuffle=False, uri=uri, max_len=model.cfg.seq_len)

    keep = ["request_id", "surface", "click", "p_click", "p_click_raw"]
    base = predict(model, stream(day, day)).filter(pl.col("click_mask")).select(keep)
    svd = (cfg.get("train") or {}).get("item_svd") or {}
    table = model.tables[model.cfg.sparse_features[model.cfg.target_pairs[0][0]][1]].weight
    rows_before = table.detach().clone()
    stats = fold_in_item_svd(model, stream(first, day - dt.timedelta(days=1)), model.cfg.topic_dim,
                             int(svd.get("max_rows", MAX_ROWS)))
    if a.topic_only:
        table.data.copy_(rows_before)
    folded = predict(model, stream(day, day)).filter(pl.col("click_mask")).select(keep)
    df = (base.join(folded.select("request_id", pl.col("p_click").alias("f"), pl.col("p_click_raw").alias("f_raw")),
                    on="request_id")
          .join(ad_ages(read_events(day), day), on="request_id", how="left"))
    print(f"model window ..{first - dt.timedelta(days=1)}; folded the logs of {first}..{day - dt.timedelta(days=1)}: {stats}")
    print(f"\nclick NE on {day}: base (as served) and with the serving-time fold-in; diff = folded - base [95% CI]\n")
    print("| surface | ad age | rows | clicks | NE base | NE folded | diff [95% CI] | raw NE base | raw NE folded |")
    print("|---|---|---|---|---|---|---|---|---|")
    for surface in [*sorted(df["surface"].unique().to_list()), ALL]:
        s = df if surface == ALL else df.filter(pl.col("surface") == surface)
        for age in (*AGE_BUCKETS, ALL):
            b = s if age == ALL else s.filter(pl.col("ad_age") == age)
            y = b["click"].to_numpy().astype(np.float64)
            if len(y) == 0 or y.sum() == 0:
                continue
            cols = {k: b[k].to_numpy() for k in ("p_click", "f")}
            boot = bootstrap_ne(y, cols, n_boot=a.n_boot, seed=0)
            lo, hi = interval(boot["f"] - boot["p_click"])
            ne = {k: normalized_entropy(y, b[k].to_numpy()) for k in ("p_click", "f", "p_click_raw", "f_raw")}
            print(f"| {surface} | {age} | {len(y)} | {int(y.sum())} | {ne['p_click']:.4f} | {ne['f']:.4f} | "
                  f"{ne['f'] - ne['p_click']:+.4f} [{lo:+.4f}, {hi:+.4f}] | {ne['p_click_raw']:.4f} | {ne['f_raw']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
