"""Embedding rows no training row reads start at zero (`train.unseen_rows: zero`; default `random`).

Why: a row that no id of the training window hashes to never gets a gradient, so it keeps its random start
(std 0.05 a coordinate, the norm of a trained row), and an id first met when serving (a user new since the
window, an ad born after it) reads as some item or user the model learnt, picked at random. A zero row reads as
no evidence at all. Cold starts only: a warm start's rows unseen in its own window were trained by the run it
loads (and zeroed by it if that run had this on); a resumed run loads them from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gem_model.data.batch import Batch
from gem_model.models.gem import GEM


@torch.no_grad()
def zero_unseen_rows(model: GEM, batches: Iterable[Batch]) -> dict[str, int]:
    """Zero every row of model.tables that no sparse feature or history column of `batches` (the training
    window, read once) reads. Returns {table: rows zeroed}."""
    cfg = model.cfg
    seen = {t: torch.zeros(rows, dtype=torch.bool) for t, rows in cfg.tables.items() if t in model.tables}
    for b in batches:
        for j, (_, table) in enumerate(cfg.sparse_features):
            if table in seen:
                seen[table][b.sparse[:, j].long().cpu()] = True
        for name, source, table in cfg.history_columns:
            if source != "ts" and table in seen:
                seen[table][b.history[name].long().cpu()] = True
    zeroed = {}
    for table, mask in seen.items():
        weight = model.tables[table].weight
        unseen = (~mask).nonzero().squeeze(1).to(weight.device)
        weight.index_fill_(0, unseen, 0.0)
        zeroed[table] = int(unseen.numel())
    return zeroed
