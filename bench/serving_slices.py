"""What serving a day in K slices costs: the fold-in of each slice counted from the bags of every day since the
window (what `serving_fold_in` did before `item_svd.Cooc`) against the counts kept per day and stretch of hours and
summed (what it does now), side by side on the same model and day; then `predict_teacher` as `teacher_predictions`
calls it (map re-fitted on its days, each served in slices) at several K. Prints a table, never pass/fail.

    GEM_HOME=<a finished demo or week> [GEM_SIMULATOR=eval] python bench/serving_slices.py --day <D> \\
        [--model <foundation version dir>] [--slices 4 12]

The two fold arms must give each slice the same topic vectors (the table says whether they did).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import polars as pl
import torch

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.data.loader import ExampleStream  # noqa: E402
from gem_model.distill.serving_fold_in import (  # noqa: E402
    HOUR,
    fold_window,
    serve_slices,
    serving_fold_in,
    with_serving,
)
from gem_model.distill.teacher import FOUNDATION, predict_teacher, read_teacher_predictions  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import models_dir, table_uri  # noqa: E402
from gem_model.train.item_svd import Bags, fold_in_item_svd  # noqa: E402


def fold_both_ways(model, config: dict, day: dt.date, uri: str) -> tuple[float, float, bool]:
    """Seconds to fold every slice of `day` by recounting all bags, and by the counts kept; whether each slice's
    topic vectors agree."""
    cfg = model.cfg
    first, last = fold_window(model, config, day)
    between = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
    bags: dict[tuple[dt.date, int], Bags] = {}

    def read(d: dt.date, hours: int) -> Bags:  # the bags were kept before too: only the counting was repeated
        if (d, hours) not in bags:
            where = None if hours >= 24 else pl.col(HOUR) < hours
            bags[d, hours] = Bags.read(model, ExampleStream(d, d, list(cfg.surfaces), uri=uri, shuffle=False,
                                                            drop_last=False, max_len=cfg.seq_len, where=where))
        return bags[d, hours]

    table = model.tables[cfg.sparse_features[cfg.target_pairs[0][0]][1]].weight
    saved = [(t, t.detach().clone()) for t in (table, model.item_topic)]
    recounted, t0 = [], time.perf_counter()
    for lo, _ in serve_slices(model, config):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            parts = [(d, 24) for d in between] + ([(day, lo)] if lo > 0 else [])
            fold_in_item_svd(model, Bags.cat(read(*p) for p in parts), cfg.topic_dim)
        recounted.append(model.item_topic.clone())
        with torch.no_grad():
            for t, before in saved:
                t.copy_(before)
    t_recount = time.perf_counter() - t0
    kept, cache, t0 = [], {}, time.perf_counter()
    for lo, _ in serve_slices(model, config):
        with serving_fold_in(model, config, day, uri=uri, before_hour=lo, cache=cache):
            kept.append(model.item_topic.clone())
    t_kept = time.perf_counter() - t0
    return t_recount, t_kept, all(torch.equal(a, b) for a, b in zip(recounted, kept, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--day", required=True, help="the day D served (after the model's window)")
    p.add_argument("--model", type=Path, default=None, help="a foundation version dir (default: the one that served D)")
    p.add_argument("--slices", type=int, nargs="+", default=[4, 12])
    a = p.parse_args(argv)
    day = dt.date.fromisoformat(a.day)
    if a.model is None:
        versions = read_teacher_predictions([day], [FOUNDATION], embeddings=False)["teacher_version"].unique().to_list()
        a.model = models_dir("foundation_model") / versions[0]
    model, config = load_model(a.model / "model.pt")
    uri = table_uri("training_examples")
    if fold_window(model, config, day) is None:
        raise SystemExit(f"{day}: no day between {a.model.name}'s window and it: pick a later day")
    print(f"{day}: {a.model.name} (window ..{config['data']['train'][-1]}), torch threads {torch.get_num_threads()}\n")
    print("| K | fold, recounted (s) | fold, counts kept (s) | recounted / kept | same vectors | predict_teacher (s) |")
    print("|---|---|---|---|---|---|")
    for k in a.slices:
        cfg = with_serving(config, serve_slices=k)
        recount, kept, same = fold_both_ways(model, cfg, day, uri)
        t0 = time.perf_counter()
        predict_teacher(model, [day], FOUNDATION, a.model.name, uri=uri, recalibrate=True, fold_in=cfg)
        served = time.perf_counter() - t0
        print(f"| {k} | {recount:.1f} | {kept:.1f} | {recount / kept:.1f}x | {same} | {served:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
