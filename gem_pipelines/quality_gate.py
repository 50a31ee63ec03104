"""The model-quality gate of every model (foundation, domain models, students) and the one way a
version becomes ACCEPTED.

Each training asset evaluates its new version on day E, calls `gate`, yields a blocking `quality_gate`
check with `check_result`, and only then calls `accept`, so every ACCEPTED file traces to an accepting check
event in the instance's event log (`untraced_accepted` lists those that do not).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from gem_pipelines.metadata import md_grid
from gem_pipelines.settings import ModelGate

CHECK = "quality_gate"
GATE_FILE = "gate.json"  # beside each gated version: its evaluation day, metric rows and verdict


def spec(asset: str, partitions_def: dg.PartitionsDefinition | None = None, extra: str = "") -> dg.AssetCheckSpec:
    """The blocking check of a training asset; `extra`: the asset's own rule, in words."""
    return dg.AssetCheckSpec(
        CHECK, asset=asset, blocking=True, partitions_def=partitions_def,
        description="on day E, every (surface, task) with enough positives: NE below the base rate, no regression "
        f"beyond max_regression against the last ACCEPTED version{extra} (assets/quality.yaml); only a passing "
        "gate writes ACCEPTED",
    )


def gate(rows: list[dict[str, Any]], previous: list[dict[str, Any]] | None, cfg: ModelGate,
         reference: list[dict[str, Any]] | None = None, allow_ungated: bool = False) -> dict[str, Any]:
    """Pass iff every gated pair has NE < max_ne (below the base rate), NE <= (1 + max_regression) x
    the last accepted NE, and (students) NE <= (1 + max_vs_labels_only) x the `reference` (labels_only) NE.
    Gated pairs: (surface, task) with at least `min_positives` positives on the evaluation day, and any
    smaller pair whose NE interval (`ne_interval`, 95%) lies wholly at or above max_ne: refused on evidence.
    `rows`, `previous` and `reference` are metric rows ({surface, task, ne, positives, ...}) on the
    same evaluation day; `previous` is None when nothing was accepted yet. With no gated pair the
    model fails (nothing shows it is sane) unless `allow_ungated`: a per-surface model of a surface
    too small to reach `min_positives` on one day then passes, with a note saying it was not judged.
    """
    prev_rows = {(r["surface"], r["task"]): r for r in previous or []}
    ref = {(r["surface"], r["task"]): r["ne"] for r in reference or []}
    pairs, failures = [], []
    for r in rows:
        if r.get("positives", 0) < cfg.min_positives:
            lo, hi = r.get("ne_interval") or (None, None)
            if lo is not None and math.isfinite(lo) and lo >= cfg.max_ne:  # too few clicks for a point, not for this
                entry = {"surface": r["surface"], "task": r["task"], "ne": r["ne"], "positives": r["positives"],
                         "accepted_ne": None, "compared": "interval", "labels_only_ne": None}
                pairs.append(entry)
                failures.append({**entry, "why": f"NE {r['ne']:.4f} [{lo:.4f}, {hi:.4f}] above the base rate "
                                                 f"on evidence ({r['positives']} positives)"})
            continue
        key = (r["surface"], r["task"])
        new_ne, old_ne, compared = like_with_like(r, prev_rows.get(key))
        entry = {"surface": key[0], "task": key[1], "ne": r["ne"], "positives": r["positives"],
                 "accepted_ne": old_ne, "compared": compared, "labels_only_ne": ref.get(key)}
        pairs.append(entry)
        ne = r["ne"]
        if not (isinstance(ne, float | int) and math.isfinite(ne) and ne < cfg.max_ne):
            failures.append({**entry, "why": f"NE {ne} >= {cfg.max_ne} (base rate)"})
        elif old_ne is not None and new_ne > old_ne * (1 + cfg.max_regression):
            failures.append({**entry, "why": f"{compared} NE {new_ne:.4f} regressed > {cfg.max_regression:.0%} vs "
                                             f"{old_ne:.4f}"})
        elif key in ref and ne > ref[key] * (1 + cfg.max_vs_labels_only):
            failures.append({**entry, "why": f"NE {ne:.4f} worse than labels_only {ref[key]:.4f} "
                                             f"by > {cfg.max_vs_labels_only:.0%}"})
    if reference is not None:
        failures += [{**p, "why": "no labels_only NE to compare with"} for p in pairs
                     if p["labels_only_ne"] is None and p["compared"] != "interval"]
    note = "" if pairs else f"not judged: no (surface, task) pair with >= {cfg.min_positives} positives on E" + (
        "; accepted unjudged (see the evaluation table)" if allow_ungated else "")
    return {"passed": not failures and (bool(pairs) or allow_ungated), "judged": bool(pairs), "gated_pairs": pairs,
            "failures": failures, "note": note}


def like_with_like(row: dict[str, Any], previous: dict[str, Any] | None) -> tuple[float, float | None, str]:
    """(new NE, accepted NE, "calibrated" | "raw"): both through their own calibrators, or both raw
    when the accepted version has none (saved before it carried one) and the new row has its raw NE."""
    if previous is None:
        return row["ne"], None, "calibrated"
    if previous.get("calibration_raw") is None and row.get("ne_raw") is not None:
        return row["ne_raw"], previous["ne"], "raw"
    return row["ne"], previous["ne"], "calibrated"


def accepted_rows(asset: str, evaluation_date: str, partition: str | None = None,
                  rescore: Callable[[Path], list[dict[str, Any]]] | None = None) -> list[dict[str, Any]] | None:
    """Metric rows of the last ACCEPTED version on `evaluation_date`, for the regression check: re-scored with
    `rescore(version_dir)` when it was gated on another day (the window moved); None when nothing is comparable."""
    from gem_model.models.registry import read_accepted

    version_dir = read_accepted(asset, partition)
    if version_dir is None:
        return None
    record = version_dir / GATE_FILE
    if record.exists():
        doc = json.loads(record.read_text())
        if doc.get("evaluation_date") == evaluation_date:
            return doc["rows"]
    return rescore(version_dir) if rescore is not None else None


def check_result(verdict: dict[str, Any], version: str, evaluation_date: str) -> dg.AssetCheckResult:
    """The blocking quality_gate check: the verdict as a table, the version it judged. A version accepted unjudged
    (no pair had enough positives) is no green pass: the check fails with WARN (yellow, blocks nothing)."""
    unjudged = verdict["passed"] and not verdict.get("judged", True)
    return dg.AssetCheckResult(
        check_name=CHECK,
        passed=verdict["passed"] and not unjudged,
        severity=dg.AssetCheckSeverity.WARN if unjudged else dg.AssetCheckSeverity.ERROR,
        description=verdict["note"] if unjudged else None,
        metadata={
            "version": version,
            "evaluation_date": evaluation_date,
            "judged": not unjudged,
            "accepted": bool(verdict["passed"]),
            "gated_pairs": len(verdict["gated_pairs"]),
            "failures": len(verdict["failures"]),
            "pairs": gate_table(verdict),
            "note": verdict["note"] or ("; ".join(f["why"] for f in verdict["failures"]) or "passed"),
        },
    )


def gate_table(verdict: dict[str, Any]) -> dg.MetadataValue:
    if not verdict["gated_pairs"]:
        return dg.MetadataValue.md(verdict["note"] or "(nothing gated)")
    failed = {(f["surface"], f["task"]): f["why"] for f in verdict["failures"]}
    cols = [c for c in ("surface", "task", "positives", "ne", "accepted_ne", "labels_only_ne")
            if any(p.get(c) is not None for p in verdict["gated_pairs"]) or c in ("surface", "task", "ne")]
    rows = [[p.get(c) for c in cols] + [failed.get((p["surface"], p["task"]), "pass")] for p in verdict["gated_pairs"]]
    return md_grid([*cols, "verdict"], rows, fmt=lambda v: f"{v:.4f}" if isinstance(v, float) else "" if v is None else str(v))


def record(version_dir: str | Path, verdict: dict[str, Any], rows: list[dict[str, Any]], evaluation_date: str) -> None:
    """Keep the gate's inputs and verdict beside the version (what the next gate compares with)."""
    from gem_model.store.atomic import write_json

    write_json(Path(version_dir) / GATE_FILE, {"evaluation_date": evaluation_date, "rows": rows, "verdict": verdict})


def accept(asset: str, version: str, verdict: dict[str, Any], partition: str | None = None) -> bool:
    """Point ACCEPTED at `version` iff its gate passed. Call after yielding `check_result`."""
    from gem_model.models.registry import write_accepted

    if verdict["passed"]:
        write_accepted(asset, version, partition)
    return bool(verdict["passed"])


def untraced_accepted(instance: dg.DagsterInstance, home: Path) -> list[str]:
    """ACCEPTED files under `home`/models with no passing quality_gate check of their version in the
    event log (empty when every accepted version was let through by a gate)."""
    from gem_model.train.refresh import REFRESH_ASSET, refresh_partition

    def folder(asset: str, partition: str | None) -> str | None:  # a refresh's date key is a YYYYMMDD folder
        return refresh_partition(dt.date.fromisoformat(partition)) if asset == REFRESH_ASSET and partition else partition

    passed: set[tuple[str, str | None, str]] = set()
    for asset in ("foundation_model", REFRESH_ASSET, "domain_models", "students"):
        for record in instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(asset), CHECK), limit=10_000
        ):
            evaluation = record.event and record.event.dagster_event and record.event.dagster_event.event_specific_data
            if evaluation is None or (version := evaluation.metadata.get("version")) is None:
                continue
            accepted = evaluation.metadata.get("accepted")  # an unjudged acceptance fails with WARN
            if getattr(evaluation, "passed", False) or (accepted is not None and accepted.value is True):
                passed.add((asset, folder(asset, getattr(evaluation, "partition", None)), str(version.value)))
    untraced = []
    for f in sorted((home / "models").glob("**/ACCEPTED")):
        rel = f.parent.relative_to(home / "models").parts
        if (rel[0], rel[1] if len(rel) > 1 else None, f.read_text().strip()) not in passed:
            untraced.append(str(f))
    return untraced
