"""Item embeddings fitted to the history co-occurrence loss before the click training
(`train.cooc_pretrain`; off by default).

The click gradient reaches an item's embedding only through the rare impressions whose history
holds it; which items share users' histories is known from every history row. One pass over the
training window fits the candidate/history item table alone to `GEM.cooc_loss` (Adam on that table
only, so the training's own row-wise Adagrad state starts clean), reusing each batch `repeats`
times with fresh random pairs. `losses` adds GEM.exposure_loss (the history scores its row's own
ad); `rescale` puts every row back to its norm before the pass, so only the directions are fitted
and the raw candidate . item match statistic starts at the scale the training expects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from gem_model.data.batch import Batch
from gem_model.models.gem import GEM

LOSSES = ("cooc", "exposure")


def pretrain_item_embeddings(model: GEM, batches: Iterable[Batch], *, repeats: int, lr: float,
                             device: torch.device | str = "cpu", losses: tuple[str, ...] = ("cooc",),
                             rescale: bool = False) -> dict[str, Any]:
    """Fit the item table of `model` to its co-occurrence (and exposure) loss over `batches`. Returns
    {"steps", "loss_first", "loss_last"} (the mean loss of the first and last batch)."""
    if not model.cfg.target_pairs:
        raise ValueError("train.cooc_pretrain needs a history item column sharing a table with a candidate id")
    if repeats < 1 or lr <= 0:
        raise ValueError("train.cooc_pretrain: repeats must be >= 1 and lr > 0")
    if not losses or set(losses) - set(LOSSES):
        raise ValueError(f"train.cooc_pretrain: losses must be a non-empty subset of {LOSSES}, not {losses}")
    j, _ = model.cfg.target_pairs[0]
    table = model.tables[model.cfg.sparse_features[j][1]]
    norms = table.weight.detach().norm(dim=1, keepdim=True).clone()
    opt = torch.optim.Adam(table.parameters(), lr=lr)
    steps, per_batch = 0, []
    for b in batches:
        b = b.to(device)
        total = 0.0
        for _ in range(repeats):
            parts = [model.cooc_loss(b) if name == "cooc" else model.exposure_loss(b) for name in losses]
            loss = torch.stack(parts).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
        per_batch.append(total / repeats)
    table.weight.grad = None
    if rescale:
        with torch.no_grad():
            table.weight.mul_(norms / table.weight.norm(dim=1, keepdim=True).clamp_min(1e-12))
    return {"steps": steps, "loss_first": per_batch[0] if per_batch else None,
            "loss_last": per_batch[-1] if per_batch else None}
