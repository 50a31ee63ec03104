"""Per-id wide offsets fitted from counts before training (`train.wide_prior`; off by default).

On rating data (Douban) the strongest signal is each user's and each item's own positive rate.
One pass of row-wise Adagrad moves a rarely seen row by about `wide_lr` per sighting whatever the
evidence (its first step is a sign step), so the offsets stay far from the logistic regression's
optimum, and a second pass overfits the deep id embeddings (E-1, bench/MODEL_SEARCH.md). This sets
each listed feature's offset, before the first step, to one Newton step of an L2-regularised
logistic regression from the heads' starting bias b:

    w[id, task] = sum over the id's rows (y - b) / (sum over them b (1 - b) + l2)

each feature on its own (no double counting inside one feature; list features that are not copies
of each other). Training then continues from there as usual.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gem_model.batch import Batch
from gem_model.models.gem import GEM


@torch.no_grad()
def set_wide_prior(model: GEM, batches: Iterable[Batch], features: list[str], l2: float,
                   max_abs: float = 3.0) -> dict[str, int]:
    """Write the offsets of `features` (sparse feature names) into model.wide_tables from `batches`
    (the training window, read once). Returns {feature: ids with at least one labelled row}."""
    cfg = model.cfg
    names = [n for n, _ in cfg.sparse_features]
    unknown = sorted(set(features) - set(names))
    if unknown:
        raise ValueError(f"train.wide_prior.features: {unknown} are not sparse features ({names})")
    if l2 <= 0:
        raise ValueError("train.wide_prior.l2 must be > 0")
    cols = [(names.index(f), cfg.sparse_features[names.index(f)][1]) for f in features]
    if len({t for _, t in cols}) < len(cols):
        raise ValueError(f"train.wide_prior.features: {features} share a wide table (one would overwrite the other)")
    heads = torch.stack([model.head_b[s] for s in cfg.surfaces]).float().cpu()  # [n_surfaces, n_tasks]
    allowed = model.task_allowed.cpu()
    n_t = heads.shape[1]
    resid = {f: torch.zeros(cfg.tables[t], n_t, dtype=torch.float64) for f, (_, t) in zip(features, cols, strict=True)}
    curv = {f: torch.zeros(cfg.tables[t], n_t, dtype=torch.float64) for f, (_, t) in zip(features, cols, strict=True)}
    for batch in batches:
        s = batch.surface_idx.long().cpu()
        b = torch.sigmoid(heads[s]).double()
        m = (batch.label_mask.cpu() & allowed[s]).double()
        r, c = (batch.labels.cpu().double() - b) * m, b * (1 - b) * m
        for f, (j, _) in zip(features, cols, strict=True):
            ids = batch.sparse[:, j].long().cpu()
            resid[f].index_add_(0, ids, r)
            curv[f].index_add_(0, ids, c)
    seen = {}
    for f, (_, table) in zip(features, cols, strict=True):
        w = (resid[f] / (curv[f] + l2)).clamp(-max_abs, max_abs)
        weight = model.wide_tables[table].weight
        weight.copy_(w.to(weight.dtype).to(weight.device))
        seen[f] = int((curv[f].sum(1) > 0).sum())
    return seen
