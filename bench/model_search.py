"""The foundation model's schedule / regularisation search, on the validation day E-1 only.

    PYTHONPATH=. GEM_HOME=<a home with the demo lake> python bench/model_search.py [--variants a b ...]
    PYTHONPATH=. GEM_HOME=<home>/eval_world python bench/model_search.py ...  # the evaluation world's lake
                                      (built by `python -m gem_pipelines.evaluate --build-only features`)
    PYTHONPATH=. python bench/model_search.py --world synthetic     # the history-only synthetic world

`--world synthetic` writes the synthetic world of tests/model/test_model_quality.py (the click
depends on the history only; 3 training days of 4000 rows, E-1 = 2026-11-04) to a temporary lake
and searches the `tiny` preset there.

Trains the foundation model (every surface, the calendar's teacher window, `--seed`, 0 by default) once per
variant of the preset's `train`/`model` settings, with validation on E-1 every `eval_every` steps and
early stopping, and reports the best E-1 click NE per surface and its step (and over every surface but the one
with the most positives: `smaller surfaces`). The evaluation day E is
never read here (data.eval is unset). Appends the table to bench/MODEL_SEARCH.md.

A real dataset's lake (`GEM_DATA=douban GEM_HOME=.gem/douban`, built by `make demo DATA=douban` or
`python -m gem_pipelines.demo --through features`) is searched the same way; its preset includes
assets/sources/<dataset>/models/<preset>.yaml. Ad-hoc variants: `--set name='{"train": {...}}'`.
The training and E-1 scoring are gem_model.train.selection's (shared with gem_pipelines.sources.validate).

`--served` also scores each variant's selected model on E-1 as `teacher_predictions` serves it: the ids born
since its window folded in first and its map re-fitted (gem_model.distill.teacher.predict_teacher, as
bench/serving_fold_in.py scores a day). A checkpoint's gain on young ads can vanish once the fold-in speaks for
them (MODEL_SEARCH.md 23): in a world with churn, a choice rests on this column.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path

import polars as pl

# `python bench/model_search.py` puts bench/ first on sys.path, where bench/kernels.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gem_model.config import dataset_name, load_calendar, load_features  # noqa: E402
from gem_model.distill.teacher import FOUNDATION, predict_teacher  # noqa: E402
from gem_model.eval.metrics import normalized_entropy  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402
from gem_model.store.schemas import COUNTER_COLUMNS, TODAY_COUNTER_COLUMNS  # noqa: E402
from gem_model.train.selection import TABLE_HEAD, score_variant, table_row, variant_features  # noqa: E402

# The counters every training_examples carries (gem_pipelines/data/counters.py), as the real datasets' features.yaml
# lists them: the ad's and the user's click rates on earlier days, which reach ads born after the window.
# EIGHT: the ones before `ad_other_*` (what the searches below named), so their variants stay as run.
EIGHT = [n for n in COUNTER_COLUMNS if not n.startswith("ad_other_")]
AD_OTHER = [n for n in COUNTER_COLUMNS if n.startswith("ad_other_")]
TODAY = list(TODAY_COUNTER_COLUMNS)


def dense(names: list[str]) -> list[dict[str, str]]:
    """features.yaml dense entries of counter columns: impressions log1p, log-odds as they are."""
    return [{"name": n, "transform": "log1p" if n.endswith("_impressions_before") else "none"} for n in names]


COUNTERS = dense(EIGHT)
SYNTHETIC_WORLD = {"n_users": 400, "n_ads": 48, "n_items": 192, "n_topics": 6, "max_hist": 16}
KR_TABLES = {"user_id": 65536, "ad_id": 32768, "hist_item_id": 32768, "advertiser_id": 32768}
# name -> overrides of assets/models/<preset>.yaml
VARIANTS: dict[str, dict] = {
    "preset": {},
    "emb_lr_0.1": {"train": {"emb_lr": 0.1}},
    "emb_lr_0.05": {"train": {"emb_lr": 0.05}},
    "emb_lr_0.003": {"train": {"emb_lr": 0.003}},
    "lr_0.003": {"train": {"lr": 0.003}},
    "wide_wd_0": {"train": {"wide_weight_decay": 0.0}},
    "emb_dropout_0.1": {"model": {"emb_dropout": 0.1}},
    "no_target_attention": {"model": {"target_attention": False}},
    # hypothesis (a) of issue 9: hash collisions of the open id vocabularies (features.yaml buckets)
    "wide_lr_0.05": {"train": {"wide_lr": 0.05}},
    "no_exact_match": {"model": {"exact_match": False}},
    "big_tables": {"buckets": {"user_id": 131072, "ad_id": 65536, "hist_item_id": 65536, "advertiser_id": 8192}},
    "emb_lr_0.03": {"train": {"emb_lr": 0.03}},
    "lr_0.03": {"train": {"lr": 0.03}},
    "epochs_3": {"train": {"epochs": 3}},
    "wide_wd_1e-3": {"train": {"wide_weight_decay": 0.001}},
    # round 2 on the evaluation world: one epoch (the second pass overfits at once), validation 6x per epoch
    "e1": {"train": {"epochs": 1, "eval_every": 39}},
    "e1_emb_dropout_0.1": {"train": {"epochs": 1, "eval_every": 39}, "model": {"emb_dropout": 0.1}},
    "e1_wide_lr_0.05": {"train": {"epochs": 1, "eval_every": 39, "wide_lr": 0.05}},
    "e1_emb_lr_0.003": {"train": {"epochs": 1, "eval_every": 39, "emb_lr": 0.003}},
    # hypothesis (c): the logistic regression's history-item x candidate crosses in the wide path
    "e1_cross": {"train": {"epochs": 1, "eval_every": 39}, "model": {"wide_cross_rows": 1 << 20}},
    "e1_cross_wide_lr_0.05": {"train": {"epochs": 1, "eval_every": 39, "wide_lr": 0.05},
                              "model": {"wide_cross_rows": 1 << 20}},
    # row-wise Adagrad adds wd * w to the gradient of every touched row: 1e-4 outweighs a rare id's
    # own gradient (~(p - y) / batch); the logistic regression's l2 is 1e-6
    "e1_cross_wide_lr_0.05_wd_1e-6": {"train": {"epochs": 1, "eval_every": 39, "wide_lr": 0.05,
                                                "wide_weight_decay": 1e-6}, "model": {"wide_cross_rows": 1 << 20}},
    "e1_cross_wide_lr_0.1_wd_1e-6": {"train": {"epochs": 1, "eval_every": 39, "wide_lr": 0.1,
                                               "wide_weight_decay": 1e-6}, "model": {"wide_cross_rows": 1 << 20}},
    # round 3 (the co-occurrence and exposure losses, cooc_pretrain) was removed with those options
    # round 4: the item table started from PPMI-SVD of the window (train.item_svd), frozen topic statistics
    "svd16": {"train": {"item_svd": {"dim": 16}}},
    "svd32": {"train": {"item_svd": {"dim": 32}}},
    "svd16_emb_lr_0.003": {"train": {"item_svd": {"dim": 16}, "emb_lr": 0.003}},
    "svd16_topic": {"train": {"item_svd": {"dim": 16}}, "model": {"topic_dim": 16}},
    "svd16_topic_epochs_2": {"train": {"item_svd": {"dim": 16}, "epochs": 2}, "model": {"topic_dim": 16}},
    "svd32_topic": {"train": {"item_svd": {"dim": 32}}, "model": {"topic_dim": 32}},
    "svd32_topic_min_lr_0.5": {"train": {"item_svd": {"dim": 32}, "min_lr_frac": 0.5}, "model": {"topic_dim": 32}},
    "svd32_topic_epochs_2": {"train": {"item_svd": {"dim": 32}, "epochs": 2}, "model": {"topic_dim": 32}},
    "svd32_topic_epochs_2_patience_4": {"train": {"item_svd": {"dim": 32}, "epochs": 2, "patience": 4},
                                        "model": {"topic_dim": 32}},
    # on the preset with item_svd + topic_dim: the item table's hash collisions now mix topics
    "big_item_table": {"buckets": {"ad_id": 65536, "hist_item_id": 65536}},
    "svd32_topic_hist_64": {"train": {"item_svd": {"dim": 32}}, "model": {"topic_dim": 32, "max_hist_len": 64}},
    "big_user_table": {"buckets": {"user_id": 262144}},  # 25% of users share a row at 20,000
    # KuaiRand (GEM_DATA=kuairand, issue 23; bench/MODEL_SEARCH.md 12): ~76k teacher rows over five tabs,
    # 74 steps an epoch at batch 1024. Douban's tables (262,144 rows for ~7.6k videos, ~6.5k authors)
    # make every step update 22M dense-gradient rows: tables sized to the data first, then the schedule
    "kr_tables": {"buckets": KR_TABLES},
    "kr_tables_lr": {"buckets": KR_TABLES, "train": {"epochs": 3, "patience": 2, "eval_every": 25, "lr": 0.001,
                                                     "emb_lr": 0.01}},
    "kr_tables_bs256": {"buckets": KR_TABLES, "train": {"batch_size": 256, "epochs": 2, "patience": 2,
                                                        "eval_every": 100, "lr": 0.0003, "emb_lr": 0.01}},
    "kr_tables_small_tabs_x3": {"buckets": KR_TABLES, "model": {"surface_loss_weights": {
        "tab_0": 3.0, "tab_4": 3.0, "tab_6": 3.0, "tab_2": 3.0}}},
    # Douban's 262,144-row demo run scored E-1 0.9341 (small tabs 0.9236, see MODEL_SEARCH.md 12): fewer collisions
    "kr_tables_64k": {"buckets": {"user_id": 65536, "ad_id": 65536, "hist_item_id": 65536, "advertiser_id": 65536}},
    # long_view (the conversion slot) as an auxiliary task: its weight off, to see what it adds
    "kr_tables_no_long_view": {"buckets": KR_TABLES, "model": {"task_loss_weights": {"click": 1.0, "conversion": 0.0}}},
    # the second pass overfits at once (kr_tables_lr, kr_tables_bs256): dropout on the id tokens, two passes
    "kr_tables_emb_dropout_e2": {"buckets": KR_TABLES, "model": {"emb_dropout": 0.2},
                                 "train": {"epochs": 2, "patience": 2, "eval_every": 25}},
    # issue 24, the churned simulated worlds: 30% of the ads are new each day, so most of E's ads were born after
    # the teacher's window; their clicks of earlier days reach the model only through the counters. Searched at
    # 50904e8 as `counters` ({"add_dense": COUNTERS}) against the preset; since afd590f the preset lists them
    "no_counters": {"drop_dense": [c["name"] for c in COUNTERS]},
    "counters_prior": {"train": {"dense_prior": {"features": [c["name"] for c in COUNTERS], "l2": 1.0}}},
    # issue 23, KuaiRand (MODEL_SEARCH.md 14): the heads' counter start fitted jointly over the tabs, each tab's
    # weights shrunk toward shared ones (train.dense_prior.pool_l2); with `fields.bid: video_duration` in
    # source.yaml (the lake re-imported), the video's duration in that start too
    **{f"kr_pool_{v}": {"train": {"dense_prior": {"features": EIGHT, "l2": 1.0, "pool_l2": v}}}
       for v in (100, 300, 1000, 3000)},
    "kr_duration": {"train": {"dense_prior": {"features": [*EIGHT, "bid"], "l2": 1.0}}},
    **{f"kr_duration_pool_{v}": {"train": {"dense_prior": {"features": [*EIGHT, "bid"], "l2": 1.0,
                                                           "pool_l2": v}}} for v in (100, 300, 1000)},
    # issue 23, KuaiRand (MODEL_SEARCH.md 15): the video on the other tabs (`ad_other_*`, a counter a single-tab
    # model reads as 0) as an input and in the heads' start, beside the adopted preset's
    **{f"kr_ad_other{sfx}": {"add_dense": dense(AD_OTHER),
                             "train": {"dense_prior": {"features": [*EIGHT, *AD_OTHER, "bid"], "l2": 1.0,
                                                       **({"pool_l2": v} if v else {})}}}
       for sfx, v in (("", 300), ("_no_pool", None), ("_pool_1000", 1000))},
    # issue 24, the churned simulated worlds (MODEL_SEARCH.md 17, not adopted): an ad is served on several
    # surfaces, so its clicks on the others add to what its own surface's counter has seen of a young ad
    "ad_other": {"add_dense": dense(AD_OTHER)},
    # issue 24: a day of the evaluation world (80k rows) outgrows the shuffle buffer and is stored in time order,
    # so the stream trained on one day at a time and E-1 swung with the day in hand (MODEL_SEARCH.md 19)
    "interleave_days": {"train": {"interleave_days": True}},
    **{f"ema_{d}": {"train": {"ema_decay": d}} for d in (0.98, 0.99)},
    # issues 24 and 23: the real-time counters (the ad earlier on the row's own day, its surface and every
    # surface): what the logs say of an ad born today, and of a video a small tab shows after the big one
    "today": {"add_dense": dense(TODAY)},
    **{f"kr_today{sfx}": {"add_dense": dense(cols),
                          "train": {"dense_prior": {"features": [*EIGHT, *AD_OTHER, *cols, "bid"], "l2": 1.0, "pool_l2": 300}}}
       for sfx, cols in (("", TODAY), ("_all", [c for c in TODAY if c.startswith("ad_all_today")]))},
    # the ad's advertiser on the row's surface and the others (`advertiser`, `kr_advertiser*`, MODEL_SEARCH.md 31) were
    # removed with their counter columns
}


def served_row(name: str, run: Path, day: str) -> str:
    """A SERVED_HEAD row: click NE of `run`'s model on `day` as served (fold-in, map re-fitted), per surface and
    their mean weighted by positives (the selection score's weighting, click alone)."""
    model, cfg = load_model(run / "model.pt")
    uri = table_uri("training_examples")
    d = dt.date.fromisoformat(day)
    pred = predict_teacher(model, [d], FOUNDATION, run.name, uri=uri, recalibrate=True, fold_in=cfg)
    clicks = pl.scan_delta(uri).filter(pl.col("date") == d).select("request_id", pl.col("click").cast(pl.Float64))
    df = pred.select("request_id", "surface", "p_click").join(clicks.collect(), on="request_id")

    ne = {str(s): (normalized_entropy(g["click"].to_numpy(), g["p_click"].to_numpy()), g["click"].sum())
          for (s,), g in sorted(df.group_by("surface"), key=lambda kv: str(kv[0]))}
    weighted = sum(v * k for v, k in ne.values()) / sum(k for _, k in ne.values())
    return f"| {name} | {weighted:.4f} | " + ", ".join(f"{s} {v:.4f}" for s, (v, _) in ne.items()) + " |"


SERVED_HEAD = ("| variant | E-1 as served: click NE, surfaces weighted by positives | per surface |\n"
               "|---|---|---|")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="small")
    p.add_argument("--variants", nargs="*", default=None, help="names of VARIANTS (default: all, unless --set)")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=JSON",
                   help='ad-hoc variants, e.g. wide_lr_0.2=\'{"train": {"wide_lr": 0.2}}\'')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world", choices=["lake", "synthetic"], default="lake")
    p.add_argument("--out", default=str(Path(__file__).with_name("MODEL_SEARCH.md")))
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each variant's run in DIR/<variant> (model.pt: "
                   "bench/item_topics.py reads it)")
    p.add_argument("--served", action="store_true",
                   help="also score each selected model on E-1 as served (fold-in, map re-fitted; a lake world)")
    a = p.parse_args()
    if a.served and a.world != "lake":
        p.error("--served scores a lake world's E-1")
    adhoc = dict(kv.split("=", 1) for kv in a.set)
    variants = {**VARIANTS, **{k: json.loads(v) for k, v in adhoc.items()}}
    a.variants = a.variants if a.variants is not None else ([] if adhoc else list(VARIANTS))
    a.variants += [k for k in adhoc if k not in a.variants]
    if a.served and (feats := [n for n in a.variants if variant_features(load_features(), variants[n]) is not None]):
        p.error(f"--served scores variants of the train and model settings; {feats} change the features, which "
                "serving reads from features.yaml: build a lake with them instead")
    keep_root = Path(a.keep) if a.keep else (Path(tempfile.mkdtemp(prefix="gem_search_runs_")) if a.served else None)
    lake = None
    if a.world == "synthetic":
        from gem_model.data.synthetic import write_synthetic_lake

        lake = tempfile.mkdtemp(prefix="gem_search_")
        days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(5)]
        write_synthetic_lake(lake, days, 4000, seed=5, history_only=True, **SYNTHETIC_WORLD)
        window, valid = (str(days[0]), str(days[2])), str(days[3])
        extra = {"epochs": 4, "eval_every": 40, "patience": 3, "lr": 0.01, "emb_lr": 0.01}
    else:
        roles = load_calendar().roles()
        window, valid = (str(roles.teacher[0]), str(roles.teacher[1])), str(roles.validation)
        extra = {}
    lines = [f"\n## {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {a.world} world ({'a temporary lake' if lake else '<home>/lake'}, GEM_DATA={dataset_name()}), preset `{a.preset}`"
             f"{' + ' + str(extra) if extra else ''}, training window {window[0]}..{window[1]}, "
             f"selection on E-1 = {valid}, seed {a.seed}\n",
             TABLE_HEAD]
    with open(a.out, "a") as f:  # the header now, each row as soon as its run ends (a stopped search keeps them)
        f.write("\n".join(lines) + "\n")
    served = []
    for name in a.variants:
        over = variants[name]
        r = score_variant(over, preset=a.preset, seed=a.seed, window=window, valid=valid, lake=lake, extra_train=extra,
                          name=f"search-{name}", keep=str(keep_root / name) if keep_root else None)
        row = table_row(name, over, r)
        print(row, flush=True)
        with open(a.out, "a") as f:
            f.write(row + "\n")
        if keep_root and a.served:
            served.append(served_row(name, keep_root / name, valid))
            print(served[-1], flush=True)
            if not a.keep:
                shutil.rmtree(keep_root / name)
    if keep_root and not a.keep:
        keep_root.rmdir()
    if served:  # after the search's table, so each stays one markdown table
        with open(a.out, "a") as f:
            f.write("\n" + SERVED_HEAD + "\n" + "\n".join(served) + "\n")


if __name__ == "__main__":
    main()
