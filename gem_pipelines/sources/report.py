"""The real-data report: no oracle exists, so every figure comes with a bootstrap interval.

Per surface on the evaluation day E: the foundation model and its single-surface baseline (the
same version), each with click NE, AUC and calibration and their 95% percentile-bootstrap
intervals; the peer targets of source.yaml; whether the hierarchical path applies (a domain of one
surface has no domain model worth the name); and the students the distillation report selected.
Written to reports/real_data_report.json and .md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from gem_model.config import load_calendar, load_surfaces
from gem_model.data import ExampleStream
from gem_model.metrics import TASKS, auc, bootstrap_ci, calibration, normalized_entropy, predict
from gem_model.paths import reports_dir
from gem_model.registry import list_versions, load_model, read_accepted
from gem_pipelines.sources.common import load_source

FOUNDATION, BASELINE = "foundation_model", "single_surface_baseline"


def _foundation_version() -> tuple[str, bool] | None:
    """(version, accepted?): the ACCEPTED teacher, else the newest one trained (the gate may refuse
    a model on real data; the report still shows what it measured, and says so)."""
    accepted = read_accepted(FOUNDATION)
    if accepted is not None:
        return accepted.name, True
    versions = list_versions(FOUNDATION)
    return (versions[-1], False) if versions else None


def _scores(checkpoint: Path, day: str, surfaces: list[str], lake: str | None) -> pl.DataFrame:
    model, _ = load_model(checkpoint)
    uri = f"{lake.rstrip('/')}/training_examples" if lake else None
    # the history length the model was trained with (as gem_model.train evaluates it)
    stream = ExampleStream(day, day, surfaces, shuffle=False, batch_size=4096, uri=uri, max_len=model.cfg.seq_len)
    return predict(model, stream)


def _metric_block(preds: pl.DataFrame, surface: str, task: str, n_boot: int) -> dict[str, Any] | None:
    s = preds.filter((pl.col("surface") == surface) & pl.col(f"{task}_mask"))
    if s.height == 0:
        return None
    y, p = s[task].to_numpy(), s[f"p_{task}"].to_numpy()
    ci = bootstrap_ci(y, p, n_boot=n_boot)
    return {"ne": normalized_entropy(y, p), "ne_ci": ci["ne"], "auc": auc(y, p), "auc_ci": ci["auc"],
            "calibration": calibration(y, p), "calibration_ci": ci["calibration"], "n": int(s.height),
            "positives": int(y.sum())}


def real_data_report(dataset: str, *, n_boot: int = 200, lake: str | None = None) -> dict[str, Any]:
    cfg = load_source(dataset)
    surfaces = load_surfaces()
    roles = load_calendar().roles()
    day = roles.evaluation.isoformat()
    found = _foundation_version()
    doc: dict[str, Any] = {
        "dataset": dataset,
        "evaluation_day": day,
        "oracle": "none: real logs have no true probabilities, so no oracle NE and no gap; "
        "95% percentile-bootstrap intervals instead (rows resampled, "
        f"{n_boot} draws)",
        "split": "see README 'Real data' and assets/sources/" + dataset + "/source.yaml",
        "foundation_version": found[0] if found else None,
        "foundation_accepted": found[1] if found else False,
        "rows": [],
        "hierarchical": {},
    }
    for domain in surfaces.domains:
        n = len(surfaces.in_domain(domain))
        doc["hierarchical"][domain] = "applicable" if n >= 2 else "not applicable: the domain has one surface"
    if found is None:
        doc["note"] = "no foundation model was trained"
        return doc
    from gem_model.paths import models_dir

    version = found[0]
    preds = {"foundation": _scores(models_dir(FOUNDATION) / version, day, surfaces.names, lake)}
    for s in surfaces.names:
        b = models_dir(BASELINE, s) / version
        if b.is_dir():
            preds[f"single_surface:{s}"] = _scores(b, day, [s], lake)
    for s in surfaces.names:
        for task in TASKS:
            if task not in surfaces.get(s).tasks:
                continue
            row: dict[str, Any] = {"surface": s, "domain": surfaces.get(s).domain, "task": task,
                                   "peer_ne": cfg.peer_ne.get(s) if task == "click" else None}
            for model, key in (("foundation", "foundation"), ("single_surface", f"single_surface:{s}")):
                if key in preds:
                    row[model] = _metric_block(preds[key], s, task, n_boot)
            doc["rows"].append(row)
    dist = reports_dir() / "distillation_report.json"
    if dist.exists():
        doc["students_selected"] = json.loads(dist.read_text()).get("selected", {})
    return doc


def _fmt(block: dict[str, Any] | None, key: str) -> str:
    if not block or block.get(key) is None or not math.isfinite(block[key]):
        return "n/a"
    lo, hi = block[f"{key}_ci"]
    return f"{block[key]:.3f} [{lo:.3f}, {hi:.3f}]"


def to_markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# {doc['dataset']}: evaluation day {doc['evaluation_day']}",
        "",
        f"Oracle: {doc['oracle']}.",
        f"Foundation version {doc['foundation_version']} ({'ACCEPTED' if doc['foundation_accepted'] else 'not accepted by the gate'}).",
        "",
        "| surface | task | n | positives | foundation NE | single-surface NE | peer NE | foundation AUC | single-surface AUC | foundation calibration |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        f, b = r.get("foundation"), r.get("single_surface")
        peer = f"{r['peer_ne']:.3f}" if r.get("peer_ne") is not None else "-"
        lines.append(
            f"| {r['surface']} | {r['task']} | {f['n'] if f else '-'} | {f['positives'] if f else '-'} | {_fmt(f, 'ne')} | "
            f"{_fmt(b, 'ne')} | {peer} | {_fmt(f, 'auc')} | {_fmt(b, 'auc')} | {_fmt(f, 'calibration')} |"
        )
    lines += ["", "Hierarchical distillation path per domain:", ""]
    lines += [f"- {d}: {v}" for d, v in doc["hierarchical"].items()]
    if doc.get("students_selected"):
        lines += ["", "Students selected on E-1: " + ", ".join(
            f"{s}: {v['arm']}/{v['path']}" for s, v in doc["students_selected"].items())]
    return "\n".join(lines) + "\n"


def write_real_report(dataset: str, *, n_boot: int = 200, lake: str | None = None) -> Path:
    doc = real_data_report(dataset, n_boot=n_boot, lake=lake)
    out = reports_dir() / "real_data_report.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    (reports_dir() / "real_data_report.md").write_text(to_markdown(doc))
    return out


def main() -> None:
    """`GEM_DATA=douban GEM_HOME=.gem/douban python -m gem_pipelines.sources.report`: (re)write the
    report from the models and lake already there (the demo writes it at its end)."""
    from gem_model.config import SIM, dataset_name

    name = dataset_name()
    if name == SIM:
        raise SystemExit("GEM_DATA names no dataset: the simulated world has an oracle (reports/foundation_eval.json)")
    path = write_real_report(name)
    print((path.with_suffix(".md")).read_text())
    print(f"written: {path}")


if __name__ == "__main__":
    main()
