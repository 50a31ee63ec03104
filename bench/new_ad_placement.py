"""Where the ads born on a day stand as it goes on: placed in the item basis, and scored.

    GEM_SIMULATOR=eval GEM_HOME=<home with the lake> python bench/new_ad_placement.py --days <D> [<D> ...] --model <dir>
        [--hours 2 4 8 12 20] [--n-boot 500]

Two tables, nothing trained (the simulator's true topics explain, no model reads them):

1. Placement: the serving fold-in (gem_model.distill.serving_fold_in) as a slice starting at hour h would run it,
   then the share of the ads born on D and logged before h whose frozen topic vector (`item_topic`) lies nearest
   the centroid of their own topic's organic items (bench/item_topics.topic_recovery), beside the older ads'.
2. Scored: D served as `teacher_predictions` serves it (its slices, map and status shifts), click NE by the ad's
   age (gem_model.eval.ad_age) and by half of the day, with the share of the oracle's gap closed and its
   95% bootstrap interval (the same resamples for the model and the oracle).

Why: the ads born on E close about 30% of the gap in the evaluation world's week against 50% for the others. If
they trail where they are already placed with their topic, what they lack is not their topic. Choose on E-1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402

from gem_model.config import load_simulator  # noqa: E402
from gem_model.data.vocab import hash_int64  # noqa: E402
from gem_model.distill.serving_fold_in import HOUR, serving_fold_in  # noqa: E402
from gem_model.distill.teacher import FOUNDATION, predict_teacher  # noqa: E402
from gem_model.eval.ad_age import AGE_BUCKETS, ad_ages, read_events  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy, read_oracle  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import storage_options, table_uri  # noqa: E402
from gem_pipelines.data.simulator import ad_own_quality, window_topics  # noqa: E402

sys.path.insert(0, str(_HERE))
from item_topics import topic_recovery  # noqa: E402

HALVES = ((0, 12), (12, 24))


def placement(model: torch.nn.Module, config: dict, day: dt.date, hours: list[int], uri: str) -> list[str]:
    """Table rows (one per hour) of the first table, for one day."""
    sim = load_simulator()
    ads, ad_topic, items, item_topic = window_topics(sim, [day])
    _, born = ad_own_quality(sim, ads, day)
    first = dict(pl.scan_delta(uri, storage_options=storage_options(uri)).filter(pl.col("date") == day)
                 .group_by("ad_id").agg(pl.col(HOUR).min()).collect().iter_rows())
    first_hour = np.array([first.get(int(a), 24) for a in ads])
    lines = []
    for h in hours:
        with serving_fold_in(model, config, day, uri=uri, before_hour=h):
            topic = model.item_topic.detach().float().numpy()
            placed = np.linalg.norm(topic[hash_int64(ads, topic.shape[0])], axis=1) > 0
            new, old = born & (first_hour < h) & placed, ~born & placed
            share = {k: topic_recovery(topic, ads[m], ad_topic[m], items, item_topic)["ads"] if m.sum() else float("nan")
                     for k, m in (("new", new), ("old", old))}
        lines.append(f"| {day} | {h} | {int(new.sum())} of {int((born & (first_hour < h)).sum())} placed | {share['new']:.1%} "
                     f"| {int(old.sum())} | {share['old']:.1%} |")
    return lines


def served(model: torch.nn.Module, config: dict, version: str, day: dt.date, uri: str) -> pl.DataFrame:
    """request_id, p_click (as served), hour, click, oracle_p, ad_age of one day."""
    preds = predict_teacher(model, [day], FOUNDATION, version, uri=uri, recalibrate=True, fold_in=config)
    rows = (pl.scan_delta(uri, storage_options=storage_options(uri)).filter(pl.col("date") == day)
            .select("request_id", HOUR, pl.col("click").cast(pl.Float64)).collect())
    oracle = read_oracle([day], uri=table_uri("oracle")).select("request_id", oracle_p="p_click")
    return (preds.select("request_id", "p_click").join(rows, on="request_id").join(oracle, on="request_id")
            .join(ad_ages(read_events(day), day), on="request_id", how="left"))


def scored(df: pl.DataFrame, n_boot: int) -> list[str]:
    """The second table, of the days' rows pooled."""
    lines = ["| ad age | hours | rows | clicks | NE | oracle NE | gap closed [95%] |", "|---|---|---|---|---|---|---|"]
    for age in AGE_BUCKETS:
        for lo, hi in HALVES:
            s = df.filter((pl.col("ad_age") == age) & pl.col(HOUR).is_between(lo, hi - 1))
            y = s["click"].to_numpy()
            if y.sum() == 0:
                continue
            p = {"model": s["p_click"].to_numpy(), "oracle": s["oracle_p"].to_numpy()}
            ne = {k: normalized_entropy(y, v) for k, v in p.items()}
            boot = bootstrap_ne(y, p, n_boot=n_boot, seed=0, chunk=50)
            g_lo, g_hi = interval((1 - boot["model"]) / (1 - boot["oracle"]))
            gap = (1 - ne["model"]) / (1 - ne["oracle"])
            lines.append(f"| {age} | {lo:02d}-{hi:02d} | {s.height:,} | {int(y.sum())} | {ne['model']:.4f} | "
                         f"{ne['oracle']:.4f} | {gap:.1%} [{g_lo:.1%}, {g_hi:.1%}] |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", required=True, type=dt.date.fromisoformat, nargs="+",
                   help="the days D, after the model's window (choose on E-1 and before)")
    p.add_argument("--model", required=True, type=Path, help="a foundation version dir")
    p.add_argument("--hours", type=int, nargs="+", default=[2, 4, 8, 12, 20])
    p.add_argument("--n-boot", type=int, default=500)
    a = p.parse_args(argv)
    torch.set_grad_enabled(False)
    model, config = load_model(a.model / "model.pt")
    uri = table_uri("training_examples")
    print(f"{a.model.name} (window ..{config['data']['train'][-1]}), days {', '.join(map(str, a.days))}\n")
    print("| day | fold before hour | born on D, logged before | with their topic | older ads | with their topic |\n"
          "|---|---|---|---|---|---|")
    for day in a.days:
        print("\n".join(placement(model, config, day, a.hours, uri)))
    df = pl.concat([served(model, config, a.model.name, day, uri) for day in a.days])
    print("\n" + "\n".join(scored(df, a.n_boot)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
