"""The real-data report: no oracle exists, so every figure comes with a bootstrap interval.

Per surface on the evaluation day E: the foundation model and its single-surface baseline (the
same version), each with click NE, AUC and calibration and their 95% percentile-bootstrap
intervals, and their NE difference paired on the same rows and resamples; the peer targets of
source.yaml; whether the hierarchical path applies (a domain of one surface has no domain model
worth the name); the students the distillation report selected; and how much the counters knew on
the days the models were fitted, selected and evaluated on (features only).
Written to reports/real_data_report.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gem_model.config import SIM, dataset_name, env, load_calendar, load_surfaces
from gem_model.data.loader import ExampleStream
from gem_model.eval.baselines import run_baselines
from gem_model.eval.metrics import (
    TASKS,
    auc,
    bootstrap_ci,
    bootstrap_ne,
    calibration,
    interval,
    normalized_entropy,
    paired_difference,
    predict,
    smaller_surfaces,
)
from gem_model.models.config import GEMConfig
from gem_model.models.registry import list_versions, load_model, read_accepted
from gem_model.store.atomic import write_json
from gem_model.store.paths import gem_home, models_dir, reports_dir, storage_options, table_uri
from gem_model.train.config import load_preset
from gem_model.train.foundation import run_foundation
from gem_pipelines.sources.common import load_source

FOUNDATION, BASELINE = "foundation_model", "single_surface_baseline"
PREDICTIONS = "eval_predictions.parquet"  # gem_model.train.loop: p_click of every clickable row of E


def _foundation_version() -> tuple[str, bool] | None:
    """(version, accepted?): the ACCEPTED teacher, else the newest one trained (the gate may refuse
    a model on real data; the report still shows what it measured, and says so)."""
    if (accepted := read_accepted(FOUNDATION)) is not None:
        return accepted.name, True
    versions = list_versions(FOUNDATION)
    return (versions[-1], False) if versions else None


def _scores(checkpoint: Path, day: str, surfaces: list[str], lake: str | None) -> pl.DataFrame:
    model, config = load_model(checkpoint)
    uri = f"{lake.rstrip('/')}/training_examples" if lake else None
    # the history length and the data view the model was trained with (as gem_model.train.loop evaluates it)
    stream = ExampleStream(day, day, surfaces, shuffle=False, batch_size=4096, uri=uri, max_len=model.cfg.seq_len,
                           own_surface=bool(config.get("data", {}).get("own_surface")))
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


def _paired(a: pl.DataFrame, b: pl.DataFrame, surface: str, task: str, n_boot: int) -> dict[str, Any]:
    """NE(a) - NE(b) on the same rows of E with its interval over the same resamples: two models' own intervals
    overlap long before the paired one contains 0."""
    rows = a.filter((pl.col("surface") == surface) & pl.col(f"{task}_mask")).select("request_id", task, pa=f"p_{task}")
    rows = rows.join(b.select("request_id", pb=f"p_{task}"), on="request_id", how="inner")
    y, pa, pb = rows[task].to_numpy().astype(float), rows["pa"].to_numpy(), rows["pb"].to_numpy()
    boot = bootstrap_ne(y, {"a": pa, "b": pb}, n_boot=n_boot, seed=0)
    point = normalized_entropy(y, pa) - normalized_entropy(y, pb)
    return {"n": rows.height, **paired_difference(boot["a"], boot["b"], point)}


# The counters' evidence: earlier impressions of the row's user on its surface, of the user elsewhere, of its
# ad on its surface and elsewhere.
EVIDENCE = ("user_impressions_before", "user_other_impressions_before", "ad_impressions_before",
            "ad_other_impressions_before")


def counter_evidence(surfaces: list[str], lake: str | None = None) -> list[dict[str, Any]]:
    """Per surface and role day (teacher's window, E-1, E): rows and the mean of each EVIDENCE counter in
    `training_examples` (no label read). A model fitted where the user's own surface knew little may
    weigh the other surfaces more than E rewards: this shows whether E is such a day."""
    roles = load_calendar().roles()
    windows = {"teacher": roles.teacher, "validation": (roles.validation,) * 2, "evaluation": (roles.evaluation,) * 2}
    role = pl.coalesce(pl.when(pl.col("date").is_between(lo, hi)).then(pl.lit(name)) for name, (lo, hi) in windows.items())
    uri = table_uri("training_examples", root=lake)
    table = (
        pl.scan_delta(uri, storage_options=storage_options(uri))
        .filter(pl.col("surface").is_in(surfaces), pl.col("date").is_between(roles.teacher[0], roles.evaluation))
        .with_columns(role=role).filter(pl.col("role").is_not_null())
        .group_by("surface", "role").agg(rows=pl.len(), **{c: pl.col(c).mean() for c in EVIDENCE}).collect()
    )
    order = {name: i for i, name in enumerate(windows)}
    return sorted(table.to_dicts(), key=lambda r: (surfaces.index(r["surface"]), order[r["role"]]))


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
        "split": "see docs/real_data.md and assets/sources/" + dataset + "/source.yaml",
        "foundation_version": found[0] if found else None,
        "foundation_accepted": found[1] if found else False,
        "rows": [],
        "hierarchical": {d: "applicable" if len(surfaces.in_domain(d)) >= 2 else "not applicable: the domain has one surface"
                         for d in surfaces.domains},
    }
    if found is None:
        doc["note"] = "no foundation model was trained"
        return doc
    version = found[0]
    preds = {"foundation": _scores(models_dir(FOUNDATION) / version, day, surfaces.names, lake)}
    for s in surfaces.names:
        b = models_dir(BASELINE, s) / version
        if b.is_dir():
            preds[f"single_surface:{s}"] = _scores(b, day, [s], lake)
    for s in surfaces.names:
        for task in (t for t in TASKS if t in surfaces.get(s).tasks):
            row: dict[str, Any] = {"surface": s, "domain": surfaces.get(s).domain, "task": task,
                                   "peer_ne": cfg.peer_ne.get(s) if task == "click" else None}
            for model, key in (("foundation", "foundation"), ("single_surface", f"single_surface:{s}")):
                if key in preds:
                    row[model] = _metric_block(preds[key], s, task, n_boot)
            if row.get("foundation") and row.get("single_surface"):
                row["foundation_minus_single"] = _paired(preds["foundation"], preds[f"single_surface:{s}"], s, task,
                                                         n_boot)
            doc["rows"].append(row)
    doc["counter_evidence"] = counter_evidence(surfaces.names, lake)
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
        "| surface | task | n | positives | foundation NE | single-surface NE | foundation - single, paired [95%] | peer NE "
        "| foundation AUC | single-surface AUC | foundation calibration | single-surface calibration |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        f, b = r.get("foundation"), r.get("single_surface")
        peer = f"{r['peer_ne']:.3f}" if r.get("peer_ne") is not None else "-"
        lines.append(
            f"| {r['surface']} | {r['task']} | {f['n'] if f else '-'} | {f['positives'] if f else '-'} | {_fmt(f, 'ne')} | "
            f"{_fmt(b, 'ne')} | {_diff(d) if (d := r.get('foundation_minus_single')) else 'n/a'} | {peer} | "
            f"{_fmt(f, 'auc')} | {_fmt(b, 'auc')} | {_fmt(f, 'calibration')} | "
            f"{_fmt(b, 'calibration')} |"
        )
    lines += ["", "Hierarchical distillation path per domain:", ""]
    lines += [f"- {d}: {v}" for d, v in doc["hierarchical"].items()]
    if doc.get("students_selected"):
        lines += ["", "Students selected on E-1: " + ", ".join(
            f"{s}: {v['arm']}/{v['path']}" for s, v in doc["students_selected"].items())]
    if doc.get("counter_evidence"):
        lines += ["", "What the counters knew (mean earlier impressions per row; features only, no label read):", "",
                  "| surface | days | rows | user on its surface | user on the other surfaces | ad on its surface "
                  "| ad on the other surfaces |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['surface']} | {r['role']} | {r['rows']:,} | " + " | ".join(f"{r[c]:.1f}" for c in EVIDENCE) + " |"
                  for r in doc["counter_evidence"]]
    return "\n".join(lines) + "\n"


def write_real_report(dataset: str, *, n_boot: int = 200, lake: str | None = None) -> Path:
    doc = real_data_report(dataset, n_boot=n_boot, lake=lake)
    out = write_json(reports_dir() / "real_data_report.json", doc)
    out.with_suffix(".md").write_text(to_markdown(doc))
    return out


def _valid_ne(version_dir: Path, surface: str) -> float:
    """The model's click NE on E-1, the day it was selected on (metrics.json `valid_rows`)."""
    rows = json.loads((version_dir / "metrics.json").read_text())["valid_rows"]
    return next(float(r["ne"]) for r in rows if r["surface"] == surface and r["task"] == "click")


LR_MODELS = ("logistic_regression", "base_rate")  # gem_model.eval.baselines: one fit per seed, beside the version


def pooled_difference(diffs: dict[str, np.ndarray], points: dict[str, float], positives: dict[str, int]) -> dict[str, Any]:
    """The positives-weighted mean of several surfaces' paired differences, resample by resample: `diffs`
    holds each surface's difference on the same bootstrap draws (each surface's rows resampled on their
    own, so a draw is a resample of E stratified by surface); `points` the differences on E itself.
    The weights are E's positives, so a surface's weight is what its NE is measured on."""
    names = list(diffs)
    w = np.array([positives[s] for s in names], dtype=np.float64)
    if not names or w.sum() <= 0:
        raise ValueError("pooled_difference: no surface with positives")
    w = w / w.sum()
    boot = np.sum([wi * np.asarray(diffs[s], dtype=np.float64) for wi, s in zip(w, names, strict=True)], axis=0)
    point = float(sum(wi * points[s] for wi, s in zip(w, names, strict=True)))
    return {"surfaces": names, "weights": {s: float(wi) for s, wi in zip(names, w, strict=True)},
            **paired_difference(boot, np.zeros_like(boot), point)}


def seeds_report(dataset: str, versions: dict[int, str], *, n_boot: int = 1000,
                 baselines: dict[int, Path] | None = None) -> dict[str, Any]:
    """Click NE on E per surface over seeds (a foundation version per seed, its baselines under the same
    version; with `baselines` {seed: dir of LR_MODELS' predictions} those too): seed mean, per-seed
    values, a 95% interval of the seed mean on resamples shared by every seed and model, the paired
    difference foundation - single-surface, and each model's E-1 NE. `pooled`: that difference over
    every surface but the one with the most positives on E, weighted by positives."""
    cfg = load_source(dataset)
    surfaces = load_surfaces()
    seeds = sorted(versions)
    preds = {}
    for seed, v in versions.items():
        preds[f"foundation|{seed}"] = pl.read_parquet(models_dir(FOUNDATION) / v / PREDICTIONS)
        preds[f"single_surface|{seed}"] = pl.concat(
            [pl.read_parquet(models_dir(BASELINE, s) / v / PREDICTIONS) for s in surfaces.names])
    models = ["foundation", "single_surface"]
    if baselines:
        models += list(LR_MODELS)
        preds |= {f"{m}|{seed}": pl.read_parquet(Path(baselines[seed]) / m / PREDICTIONS) for seed in seeds for m in LR_MODELS}
    first = next(iter(preds.values())).select("request_id", "surface", "click")
    for k, df in preds.items():
        first = first.join(df.select("request_id", pl.col("p_click").alias(k)), on="request_id", how="inner")
    doc: dict[str, Any] = {"dataset": dataset, "evaluation_day": load_calendar().roles().evaluation.isoformat(),
                           "seeds": seeds, "versions": {str(k): v for k, v in versions.items()}, "n_boot": n_boot,
                           "rows": []}
    diffs: dict[str, np.ndarray] = {}
    for s in surfaces.names:
        sub = first.filter(pl.col("surface") == s)
        y = sub["click"].to_numpy().astype(float)
        boot = bootstrap_ne(y, {k: sub[k].to_numpy() for k in preds}, n_boot=n_boot, seed=0)
        row: dict[str, Any] = {"surface": s, "n": int(len(y)), "positives": int(y.sum()), "peer_ne": cfg.peer_ne.get(s)}
        mean_boot = {}
        for model in models:
            per_seed = [normalized_entropy(y, sub[f"{model}|{seed}"].to_numpy()) for seed in seeds]
            mean_boot[model] = np.mean([boot[f"{model}|{seed}"] for seed in seeds], axis=0)
            lo, hi = interval(mean_boot[model])
            row[model] = {"ne": float(np.mean(per_seed)), "ne_ci": [lo, hi], "per_seed": per_seed}
            if model in ("foundation", "single_surface"):
                valid = [_valid_ne(models_dir(FOUNDATION) / versions[seed] if model == "foundation"
                                   else models_dir(BASELINE, s) / versions[seed], s) for seed in seeds]
                row[model] |= {"valid_ne": float(np.mean(valid)), "valid_per_seed": valid}
        diffs[s] = mean_boot["foundation"] - mean_boot["single_surface"]
        row["foundation_minus_single"] = paired_difference(
            mean_boot["foundation"], mean_boot["single_surface"], row["foundation"]["ne"] - row["single_surface"]["ne"])
        doc["rows"].append(row)
    if (small := smaller_surfaces(doc["rows"])) is not None:
        doc["pooled"] = pooled_difference({r["surface"]: diffs[r["surface"]] for r in small},
                                          {r["surface"]: r["foundation_minus_single"]["diff"] for r in small},
                                          {r["surface"]: r["positives"] for r in small})
    return doc


def _ci(block: dict[str, Any] | None) -> str:
    return f"{block['ne']:.3f} [{block['ne_ci'][0]:.3f}, {block['ne_ci'][1]:.3f}]" if block else "-"


def _diff(d: dict[str, Any]) -> str:
    verdict = d["verdict"].replace("a better", "foundation better").replace("b better", "single-surface better")
    return f"{d['diff']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] ({verdict})"


def seeds_markdown(doc: dict[str, Any]) -> str:
    lines = [f"# {doc['dataset']}: click NE on E = {doc['evaluation_day']}, seeds {doc['seeds']} (mean, 95% bootstrap "
             f"interval of the seed mean, {doc['n_boot']} resamples of E's rows, the same for every model)", "",
             "| surface | test positives | foundation NE | single-surface NE | foundation - single [95%] | "
             "logistic regression NE | base rate NE | peer NE | E-1 (selection day): foundation / single-surface |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        f, b = r["foundation"], r["single_surface"]
        lines.append(f"| {r['surface']} | {r['positives']:,} | {_ci(f)} | {_ci(b)} | {_diff(r['foundation_minus_single'])} | "
                     f"{_ci(r.get('logistic_regression'))} | {_ci(r.get('base_rate'))} | "
                     f"{r['peer_ne'] if r['peer_ne'] is not None else '-'} | {f['valid_ne']:.4f} / {b['valid_ne']:.4f} |")
    if p := doc.get("pooled"):
        lines += ["", f"Pooled over the small surfaces ({', '.join(f'{s} {w:.2f}' for s, w in p['weights'].items())}: "
                  f"weights = positives on E), foundation - single-surface: {_diff(p)}"]
    return "\n".join(lines) + "\n"


def _own_surface_baseline(bdir: Path) -> bool:
    """A baseline with its predictions on E, trained on its surface's data alone (gem_model.data.own_surface:
    versions from before that rule read every surface's history and counters)."""
    cfg = bdir / "config.json"
    return (bdir / PREDICTIONS).is_file() and cfg.is_file() and bool(json.loads(cfg.read_text())["data"].get("own_surface"))


def _same_setting(preset: Any, trained: Any) -> bool:
    """The preset's value was the run's: a nested block may carry the defaults the typed config filled
    in (item_svd {dim: 32} was run as {dim: 32, max_rows: 8192})."""
    if isinstance(preset, dict) and isinstance(trained, dict):
        return all(_same_setting(v, trained.get(k)) for k, v in preset.items())
    return preset == trained


MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GEMConfig) if f.default is not dataclasses.MISSING}


def runs_preset(spec: dict[str, Any], trained: dict[str, Any], seed: int) -> bool:
    """Whether a run's config.json is this seed run with the preset's model and train values; a model option
    the run's config does not name ran at its default (it may predate the option)."""
    blocks = {"model": {**MODEL_DEFAULTS, **trained["model"]}, "train": trained["train"]}
    return trained.get("seed") == seed and all(_same_setting(val, blocks[k].get(key)) for k in ("model", "train")
                                               for key, val in spec[k].items())


def trained_version(seed: int, preset: str) -> str | None:
    """A foundation version already trained with this seed and the preset's current hyperparameters
    (the demo's, or an earlier --seeds run), with every baseline's predictions on E: the ACCEPTED one
    first, else the newest. None: train one."""
    spec = load_preset(preset)
    accepted = read_accepted(FOUNDATION)
    for v in ([accepted.name] if accepted is not None else []) + list_versions(FOUNDATION)[::-1]:
        path = models_dir(FOUNDATION) / v / "config.json"
        if not path.is_file():
            continue
        same = runs_preset(spec, json.loads(path.read_text()), seed)
        bdirs = [models_dir(BASELINE, s) / v for s in load_surfaces().names]
        if same and (models_dir(FOUNDATION) / v / PREDICTIONS).is_file() and all(_own_surface_baseline(b) for b in bdirs):
            return v
    return None


def lr_baselines(seed: int, version: str) -> Path:
    """LR_MODELS fitted with this seed on the teacher's window (epoch kept on E-1), beside the foundation
    version as gem_model.eval.model_quality puts them; reused when already there."""
    out = models_dir(FOUNDATION) / version / "baselines" / f"seed{seed}"
    if all((out / m / PREDICTIONS).is_file() for m in LR_MODELS):
        return out
    calendar = load_calendar()
    roles = calendar.roles()
    days = [str(d) for d in calendar.dates() if roles.teacher[0] <= d <= roles.teacher[1]]
    uri = table_uri("training_examples")
    run_baselines(days, str(roles.validation), str(roles.evaluation), out, uri=uri, seed=seed,
                  storage_options=storage_options(uri))
    return out


def run_seeds(dataset: str, seeds: list[int], preset: str) -> Path:
    """The foundation + baselines of every seed on the lake already built (selection on E-1): reused
    where already trained (trained_version), else trained now; then reports/real_data_seeds.{json,md}."""
    versions = {seed: trained_version(seed, preset) or run_foundation(preset, seeds=(seed,), baselines=True)["version"]
                for seed in seeds}
    doc = seeds_report(dataset, versions, baselines={seed: lr_baselines(seed, versions[seed]) for seed in seeds})
    out = write_json(reports_dir() / "real_data_seeds.json", doc)
    out.with_suffix(".md").write_text(seeds_markdown(doc))
    return out


def main(argv: list[str] | None = None) -> None:
    """`GEM_DATA=douban GEM_HOME=.gem/douban python -m gem_pipelines.sources.report`: (re)write the
    report from the models and lake already there (the demo writes it at its end). With `--seeds 0 1 2`:
    train the foundation and its baselines once per seed and write reports/real_data_seeds.md."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--preset", default=env("GEM_MODEL_PRESET"))
    args = ap.parse_args(argv)
    name = dataset_name()
    if name == SIM:
        raise SystemExit("GEM_DATA names no dataset: the simulated world has an oracle (reports/foundation_eval.json)")
    if not args.seeds and _foundation_version() is None:
        raise SystemExit(f"no foundation_model under {gem_home()}/models: run `make demo DATA={name}` first (or set "
                         "GEM_HOME to the home it wrote)")
    path = run_seeds(name, args.seeds, args.preset) if args.seeds else write_real_report(name)
    print((path.with_suffix(".md")).read_text())
    print(f"written: {path}")


if __name__ == "__main__":
    main()
