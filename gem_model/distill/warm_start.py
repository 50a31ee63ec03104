"""Warm start of a production student from the last ACCEPTED student of its surface.

Retraining from the ACCEPTED weights keeps what they learnt and needs fewer steps to track the new days.
It is done whenever the ACCEPTED student is the same network: its whole config but the keys that only
steer training (IGNORED_KEYS), and every parameter's shape (an arm that adds a head or an input starts
cold). A cold start logs its reason and keeps it in the train info (`warm_start`). The parameter-sharing
arm copies the teacher's tables over the warm ones, as over a cold start.

Item-table rows the new window meets for the first time are folded in as the teacher's warm retrain does
(gem_model.train.item_svd.fold_in_rows): the PPMI-weighted mean of the known rows they share histories with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from gem_model.distill.dataset import StudentData
from gem_model.distill.student import Student
from gem_model.train.item_svd import MAX_ROWS, bag_counts, fold_in_rows, ppmi

log = logging.getLogger(__name__)

IGNORED_KEYS = ("seed", "arm", "path", "teacher")  # config keys that may differ: they steer training only
NO_SOURCE = {"warm_start_from": None, "warm_start": "cold: no ACCEPTED student to start from"}


def warm_start(model: Student, source: str | Path | None, data: StudentData | None = None) -> dict[str, Any]:
    """Load the weights of the saved student `source` (a version directory or its model.pt) into `model`
    when compatible. Returns {"warm_start_from": source or None, "warm_start": "warm" | "cold: <reason>"}
    (+ "folded_in": item rows of `data`, the new training window, folded into the old ones).
    An unreadable checkpoint is an error (ValueError naming it), not a silent cold start."""
    if source is None:
        return dict(NO_SOURCE)
    path = Path(source)
    file = path / "model.pt" if path.is_dir() else path
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
        cfg, state = dict(saved["config"]), saved["state_dict"]
    except Exception as e:  # torch raises several types for a missing, truncated or foreign file
        raise ValueError(f"{file}: cannot load the ACCEPTED student to warm-start from: {e}") from e
    if reason := _incompatible(cfg, state, model):
        log.warning("student %s/%s/%s starts cold: %s", model.cfg.get("surface"), model.cfg.get("arm"),
                    model.cfg.get("path"), reason)
        return {"warm_start_from": None, "warm_start": f"cold: {reason}"}
    model.load_state_dict(state)
    out: dict[str, Any] = {"warm_start_from": str(path), "warm_start": "warm"}
    if seen := saved.get("seen_rows"):
        model.seen_rows = {t: v.long() for t, v in seen.items()}
        if data is not None:
            out["folded_in"] = fold_in_student(model, data, model.seen_rows)
    return out


@torch.no_grad()
def fold_in_student(model: Student, data: StudentData, seen: dict[str, torch.Tensor], max_rows: int = MAX_ROWS) -> int:
    """Fold the item-table rows of `data` absent from `seen` into the known ones (module doc): one bag
    per row, its history ids and its candidate ids of that table. Returns the rows folded."""
    table = model.cfg["hist_table"]
    if model.hist_k <= 0 or table not in seen:
        return 0  # no history: nothing co-occurs
    cols = [j for j, (_, t) in enumerate(model.cfg["sparse_features"]) if t == table]
    n = len(data)
    items = torch.cat([data.hist_ids.long().flatten(), *[data.sparse[:, j].long() for j in cols]])
    rows = torch.cat([torch.arange(n).repeat_interleave(data.hist_ids.shape[1]), *[torch.arange(n) for _ in cols]])
    window, counts = bag_counts(rows, items, n, max_rows)
    if len(window) == 0:
        return 0
    have = torch.isin(window, seen[table])
    w = model.tables[table].weight
    emb = w.detach()[window.to(w.device)].float().cpu()
    scale = float(emb[have].norm(dim=1).mean()) if have.any() else float(w.detach().norm(dim=1).mean())
    folded = fold_in_rows(ppmi(counts), have, [(emb, scale)])
    w[window[folded].to(w.device)] = emb[folded].to(w.dtype).to(w.device)
    return int(folded.sum())


def _incompatible(cfg: dict[str, Any], state: dict[str, torch.Tensor], model: Student) -> str | None:
    """Why the saved student cannot seed `model`, or None."""
    new = model.cfg
    if keys := sorted(k for k in set(cfg) | set(new) if k not in IGNORED_KEYS and cfg.get(k) != new.get(k)):
        shown = ", ".join(f"{k}={cfg.get(k)!r} (now {new.get(k)!r})" for k in keys[:3])
        return f"the ACCEPTED student differs in {shown}" + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    own = model.state_dict()
    shapes = sorted(k for k in set(own) | set(state)
                    if k not in own or k not in state or tuple(own[k].shape) != tuple(state[k].shape))
    if shapes:
        return f"parameters {shapes[:3]} differ in name or shape" + (f" (+{len(shapes) - 3})" if len(shapes) > 3 else "")
    return None
