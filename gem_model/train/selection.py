"""Model selection on the validation day E-1 only: the one place that trains a variant of a preset
and scores it on E-1. `bench/model_search.py` (named variants, a table appended to
bench/MODEL_SEARCH.md) and `gem_pipelines.sources.validate` (a real dataset's JSON overrides) are
thin command lines over `score_variant`. The evaluation day E is never read here (data.eval unset).
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

from gem_model.config import FeaturesConfig, env, load_calendar, load_features
from gem_model.eval.metrics import smaller_surfaces


def variant_features(features: FeaturesConfig, overrides: dict[str, Any]) -> FeaturesConfig | None:
    """features.yaml as a variant of the search sees it: other table sizes for some hashed features
    (`buckets`: {feature: rows}), some dense or sparse features left out (`drop_dense`, `drop_sparse`:
    [names]) or dense ones added (`add_dense`: [{name, transform}], columns training_examples already
    has, such as the counters); None: as is."""
    buckets, drop = overrides.get("buckets") or {}, set(overrides.get("drop_dense") or ())
    add, drop_sparse = list(overrides.get("add_dense") or ()), set(overrides.get("drop_sparse") or ())
    if not buckets and not drop and not add and not drop_sparse:
        return None
    raw = features.model_dump()
    if unknown := drop - {f["name"] for f in raw["dense"]}:
        raise ValueError(f"drop_dense: {sorted(unknown)} are not dense features of features.yaml")
    if unknown := drop_sparse - {f["name"] for f in raw["sparse"]}:
        raise ValueError(f"drop_sparse: {sorted(unknown)} are not sparse features of features.yaml")
    raw["sparse"] = [f for f in raw["sparse"] if f["name"] not in drop_sparse]
    if twice := {f["name"] for f in add} & {f["name"] for f in raw["dense"] if f["name"] not in drop}:
        raise ValueError(f"add_dense: {sorted(twice)} are dense features of features.yaml already")
    raw["dense"] = [f for f in raw["dense"] if f["name"] not in drop] + add
    for f in [*raw["sparse"], *raw["history"]["columns"]]:
        if f["name"] in buckets:
            f["buckets"] = buckets[f["name"]]
    return FeaturesConfig.model_validate(raw)


def score_variant(
    overrides: dict[str, Any], *, preset: str = "small", seed: int = 0, surfaces: list[str] | None = None,
    window: tuple[str, str] | None = None, valid: str | None = None, lake: str | None = None,
    extra_train: dict[str, Any] | None = None, name: str = "validate", keep: str | None = None,
) -> dict[str, Any]:
    """Train the preset + `overrides` ({"model", "train", "buckets", "drop_dense", "drop_sparse", "add_dense"})
    on the calendar's teacher window (or `window`), validating on E-1 (or `valid`) every `eval_every`
    steps with early stopping. Returns the best E-1 score (click NE weighted by positives), its step,
    the score by step and the best checkpoint's E-1 click NE per surface."""
    from gem_model.train.loop import train

    if window is None or valid is None:
        roles = load_calendar().roles()
        window = window or (roles.teacher[0].isoformat(), roles.teacher[1].isoformat())
        valid = valid or roles.validation.isoformat()
    cfg = {"preset": preset, "model": overrides.get("model") or {},
           "train": {"log_every": 10**6, **(extra_train or {}), **(overrides.get("train") or {})},
           "data": {"train": list(window), "valid": valid, "eval": None, "surfaces": surfaces, "lake": lake,
                    "oracle": False},
           "seed": seed, "device": env("GEM_DEVICE"),
           "tracking": {"project": "validate", "group": "validate", "name": name, "job_type": "validate"}}
    features = variant_features(load_features(), overrides)
    t = time.time()
    with tempfile.TemporaryDirectory() as out:  # unused when `keep` names the run's folder
        s = train(cfg, out_dir=keep or out, features=features)
    clicks = [r for r in s["valid_rows"] if r["task"] == "click" and math.isfinite(r["ne"])]
    return {"score": s["best_valid_score"], "best_step": s["best_step"], "steps": s["step"],
            "valid_history": s["valid_history"], "seconds": round(time.time() - t),
            "ne": {r["surface"]: r["ne"] for r in clicks}, "smaller": smaller_surfaces_ne(clicks)}


def smaller_surfaces_ne(rows: list[dict[str, Any]]) -> float | None:
    """Click NE of gem_model.eval.metrics.smaller_surfaces' rows, weighted by positives (KuaiRand's tab 1 has
    7,697 of E-1's positives); None where that gives none."""
    if (rest := smaller_surfaces(rows)) is None:
        return None
    return sum(r["ne"] * r["positives"] for r in rest) / sum(r["positives"] for r in rest)


TABLE_HEAD = ("| variant | overrides | best E-1 score | best step / steps | E-1 click NE per surface | smaller surfaces | "
              "E-1 score by step | train s |\n|---|---|---|---|---|---|---|---|")


def table_row(name: str, overrides: dict[str, Any], r: dict[str, Any]) -> str:
    """One row of TABLE_HEAD (bench/MODEL_SEARCH.md)."""
    per = ", ".join(f"{s} {ne:.4f}" for s, ne in r["ne"].items())
    curve = " ".join(f"{int(st)}:{sc:.4f}" for st, sc in r["valid_history"])
    smaller = "-" if r.get("smaller") is None else f"{r['smaller']:.4f}"
    return (f"| {name} | `{overrides}` | {r['score']:.4f} | {r['best_step']} / {r['steps']} | {per} | {smaller} | "
            f"{curve} | {r['seconds']} |")
