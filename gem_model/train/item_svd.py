"""Item embeddings started from the training window's co-occurrence structure (`train.item_svd`;
off by default).

The click gradient reaches an ad's or item's embedding only through the few clicks whose history
holds it, and SGD on in-batch co-occurrence losses moves the rows too slowly within one epoch
(bench/MODEL_SEARCH.md). Which items share users' histories, and which ads are shown next to which
histories (ads are delivered by targeting on users' interests), is known from every row of the
window at once. Before the first step this builds one bag per training row (its history items and
its candidate ad, each once), counts how often two rows of the shared item table meet in a bag,
takes the positive pointwise mutual information of those counts and its leading `dim` singular
vectors (the classical PPMI-SVD word embedding, Levy & Goldberg 2014), and writes each seen row's
direction into the first `dim` coordinates of its embedding, at the table's mean starting norm (the
other coordinates start at 0, unseen rows keep their random start). Training then continues as
usual from there. With `model.topic_dim` the same directions also go, frozen, into the model's
`item_topic` buffer, which the topic match statistics read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch

from gem_model.data.batch import Batch
from gem_model.models.gem import GEM
from gem_model.models.layers import segment_ids

MAX_ROWS = 8192  # default cap on the rows fitted


def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """max(0, log(C * total / (row sum * column sum))) of a symmetric count matrix; 0 where C is 0."""
    c = counts.float()
    total = c.sum()
    expected = c.sum(1, keepdim=True) * c.sum(0, keepdim=True)
    out = torch.log(c * total / expected.clamp_min(1e-300)).clamp_min(0.0)
    return torch.where(c > 0, out, torch.zeros_like(out))


@torch.no_grad()
def set_item_svd(model: GEM, batches: Iterable[Batch], dim: int, max_rows: int = MAX_ROWS) -> dict[str, int]:
    """Write PPMI-SVD directions of the item table shared by the candidate and the history into
    `model`'s embeddings, from `batches` (the training window, read once). Returns {"rows": rows
    written, "bags": rows read}. Only the `max_rows` rows met in the most bags are fitted (the count
    matrix is dense: max_rows^2 floats); the others keep their random start."""
    cfg = model.cfg
    if not cfg.target_pairs:
        raise ValueError("train.item_svd needs a history item column sharing a table with a candidate id")
    if not 1 <= dim <= cfg.d_model:
        raise ValueError(f"train.item_svd.dim must be in 1..d_model ({cfg.d_model}), not {dim}")
    if cfg.n_topic_stats and cfg.topic_dim != dim:
        raise ValueError(f"train.item_svd.dim ({dim}) must equal model.topic_dim ({cfg.topic_dim})")
    j, col = cfg.target_pairs[0]
    table = model.tables[cfg.sparse_features[j][1]]
    bag_rows: list[torch.Tensor] = []
    bag_items: list[torch.Tensor] = []
    bags = 0
    for batch in batches:
        items = batch.history[col].long().cpu()
        seg = segment_ids(batch.offsets.long().cpu(), len(items))
        ads = batch.sparse[:, j].long().cpu()
        bag_rows += [seg + bags, torch.arange(len(ads)) + bags]
        bag_items += [items, ads]
        bags += len(ads)
    rows, items = torch.cat(bag_rows), torch.cat(bag_items)
    keep = items != 0  # row 0: null / unknown id
    rows, items = rows[keep], items[keep]
    seen, compact = torch.unique(items, return_inverse=True)
    if len(seen) > max_rows:  # the rows met in the most bags
        top = torch.topk(torch.bincount(compact, minlength=len(seen)), max_rows).indices.sort().values
        remap = torch.full((len(seen),), -1, dtype=torch.long)
        remap[top] = torch.arange(max_rows)
        compact = remap[compact]
        rows, compact, seen = rows[compact >= 0], compact[compact >= 0], seen[top]
    if len(seen) <= dim:
        return {"rows": 0, "bags": bags}
    pairs = torch.unique(rows * len(seen) + compact)  # each item once per bag
    h = torch.sparse_coo_tensor(torch.stack([pairs // len(seen), pairs % len(seen)]), torch.ones(len(pairs)),
                                (bags, len(seen)), is_coalesced=True, check_invariants=True)
    with warnings.catch_warnings():  # sparse x sparse goes through CSR, which torch calls beta
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        counts = torch.sparse.mm(h.t().coalesce(), h).to_dense()
    counts.fill_diagonal_(0.0)
    u, s, _ = torch.svd_lowrank(ppmi(counts), q=min(dim + 8, len(seen)), niter=6)
    vec = torch.nn.functional.normalize(u[:, :dim] * s[:dim].sqrt(), dim=1)
    w = table.weight
    scale = w.norm(dim=1).mean()
    new = torch.zeros(len(seen), w.shape[1])
    new[:, :dim] = vec * scale.cpu()
    w[seen.to(w.device)] = new.to(w.dtype).to(w.device)
    if cfg.n_topic_stats:  # the frozen copy the topic statistics read (GEMConfig.topic_dim)
        model.item_topic.zero_()
        model.item_topic[seen.to(w.device)] = vec.to(model.item_topic.device)
    return {"rows": int(len(seen)), "bags": bags}
