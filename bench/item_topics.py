"""Does an item table know the simulator's topics? (issue 9: the missing piece of the foundation model)

    GEM_SIMULATOR=eval GEM_HOME=<home>/eval_world PYTHONPATH=. python bench/item_topics.py [--svd 32] [RUN/model.pt ...]

For each trained model (a `model.pt`, e.g. from `bench/model_search.py --keep DIR`) and, with
`--svd DIM`, for the PPMI-SVD start of `train.item_svd` computed on the calendar's teacher window of
the lake (gem_model.train.item_svd, as train runs it), prints how far the shared item table of ads and
organic items carries the true topics of the simulator's world (which no model reads):

- ads / items: share whose nearest topic centroid (mean direction of the organic items of a topic)
  is their own topic; chance is 1 / n_topics;
- cos same / other: mean cosine of an ad and an organic item of the same topic, of different topics.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gem_model.data.vocab import hash_int64  # noqa: E402


def topic_recovery(table: np.ndarray, ad_ids: np.ndarray, ad_topic: np.ndarray, item_ids: np.ndarray,
                   item_topic: np.ndarray) -> dict[str, float]:  # fmt: skip
    """Ads and organic items by id (the simulator's churn gives new ids every day), hashed as the Encoder does."""
    n_ads, n_topics = len(ad_topic), int(max(ad_topic.max(), item_topic.max())) + 1
    rows = hash_int64(np.concatenate([ad_ids, item_ids]), table.shape[0])
    e = table[rows] / np.linalg.norm(table[rows], axis=1, keepdims=True).clip(1e-12)
    ads, items = e[:n_ads], e[n_ads:]
    cent = np.stack([items[item_topic == t].mean(0) for t in range(n_topics)])
    cos = ads @ items.T
    same = ad_topic[:, None] == item_topic[None, :]
    return {"ads": float((np.argmax(ads @ cent.T, 1) == ad_topic).mean()),
            "items": float((np.argmax(items @ cent.T, 1) == item_topic).mean()),
            "cos_same": float(cos[same].mean()), "cos_other": float(cos[~same].mean()), "chance": 1 / n_topics}


def svd_table(dim: int) -> np.ndarray:
    """The item table train.item_svd starts from, on the calendar's teacher window of the lake."""
    from gem_model.config import load_calendar, load_features, load_surfaces
    from gem_model.data.loader import ExampleStream
    from gem_model.models.config import GEMConfig
    from gem_model.models.gem import build_model
    from gem_model.store.paths import table_uri
    from gem_model.train.config import load_preset
    from gem_model.train.item_svd import set_item_svd

    features, surfaces = load_features(), load_surfaces()
    preset = load_preset("small")
    cfg = GEMConfig.from_specs({**preset["model"], "topic_dim": 0}, features=features, surfaces=surfaces)
    model = build_model(cfg)
    roles = load_calendar().roles()
    stream = ExampleStream(roles.teacher[0].isoformat(), roles.teacher[1].isoformat(), None, batch_size=4096,
                           shuffle=False, features=features, surfaces_config=surfaces,
                           uri=table_uri("training_examples"), max_len=cfg.seq_len)
    set_item_svd(model, stream, dim)
    j, _ = cfg.target_pairs[0]
    return model.tables[cfg.sparse_features[j][1]].weight.detach().numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="model.pt files")
    p.add_argument("--svd", type=int, default=None, metavar="DIM", help="also the PPMI-SVD start of this width")
    a = p.parse_args()
    from gem_model.config import load_calendar, load_simulator
    from gem_model.models.registry import load_model
    from gem_pipelines.data.simulator import window_topics

    first, last = load_calendar().roles().teacher  # the ads and items alive on the teacher's days
    days = [d for d in load_calendar().dates() if first <= d <= last]
    truth = window_topics(load_simulator(), days)
    tables = {f"item_svd dim {a.svd} (the start)": svd_table(a.svd)} if a.svd else {}
    for path in a.models:
        model, _ = load_model(Path(path))
        j, _ = model.cfg.target_pairs[0]
        tables[path] = model.tables[model.cfg.sparse_features[j][1]].weight.detach().float().numpy()
    print("| item table | ads with their topic | items with their topic | cos same topic | cos other topics |")
    print("|---|---|---|---|---|")
    for name, t in tables.items():
        r = topic_recovery(t, *truth)
        print(f"| {name} | {r['ads']:.1%} | {r['items']:.1%} | {r['cos_same']:.3f} | {r['cos_other']:.3f} |")
    print(f"\nchance: {r['chance']:.1%}" if tables else "nothing to look at: give model.pt files or --svd")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    torch.manual_seed(0)  # torch.svd_lowrank draws its random projection from the global generator
    main()
