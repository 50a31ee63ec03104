"""The model-quality gate: which (surface, task) pairs count, and whether a new version passes."""

from __future__ import annotations

from typing import Any

from gem_pipelines.settings import ModelGate


def gate(rows: list[dict[str, Any]], previous: list[dict[str, Any]] | None, cfg: ModelGate) -> dict[str, Any]:
    """Pass iff every gated pair has NE < max_ne and NE <= (1 + max_regression) x the last accepted NE.

    Gated pairs: (surface, task) with at least `min_positives` positives on the evaluation day.
    `rows` and `previous` are metric rows ({surface, task, ne, positives, ...}) of one model on the
    same evaluation day; `previous` is None when nothing was accepted yet.
    """
    prev = {(r["surface"], r["task"]): r["ne"] for r in previous or []}
    pairs, failures = [], []
    for r in rows:
        if r.get("positives", 0) < cfg.min_positives:
            continue
        key = (r["surface"], r["task"])
        entry = {"surface": key[0], "task": key[1], "ne": r["ne"], "positives": r["positives"],
                 "accepted_ne": prev.get(key)}
        pairs.append(entry)
        if not r["ne"] < cfg.max_ne:
            failures.append({**entry, "why": f"NE {r['ne']:.4f} >= {cfg.max_ne}"})
        elif key in prev and r["ne"] > prev[key] * (1 + cfg.max_regression):
            failures.append({**entry, "why": f"NE {r['ne']:.4f} regressed > {cfg.max_regression:.0%} vs {prev[key]:.4f}"})
    return {"passed": not failures and bool(pairs), "gated_pairs": pairs, "failures": failures,
            "note": "" if pairs else f"no (surface, task) pair has >= {cfg.min_positives} positives"}
