"""The distillation experiment (every arm x path x surface x seed, side by side) and the production
student per surface.

Calendar (assets/calendar.yaml): students train on roles().student (up to E-2), the Student Adapter on
roles().adapter (E-2) alone, the epoch kept and the (arm, path) selected on roles().validation (E-1),
and both E-1 (split "validation") and E (split "evaluation") are reported. Selection never reads E.

KD effectiveness of an arm (click task, per surface and split, from seed means):
    (NE_labels_only - NE_arm) / (NE_labels_only - NE_standard_kd)    (standard_kd on the same path)
It is None for labels_only and standard_kd, and None when the denominator is <= KD_EPS (standard
KD did not beat labels-only by a measurable margin: the ratio is then undefined or its sign is
meaningless). Rows also carry both differences ("kd_gain", "kd_gain_standard") so nothing is hidden.
On E the gains carry paired bootstrap intervals (gem_model.distill.kd_intervals), and the ratio is
kept only where standard KD's gain interval lies above 0 (else kd_report = "two gains").
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gem_model.config import DayRoles, SurfacesConfig, load_calendar, load_features, load_surfaces
from gem_model.data.loader import TASKS, date_range
from gem_model.distill.adapter import StudentAdapter
from gem_model.distill.arms import BASELINE, STANDARD, arm_paths, arm_spec
from gem_model.distill.config import load_student_preset
from gem_model.distill.dataset import StudentData, attach_teacher, load_examples
from gem_model.distill.export import export_student
from gem_model.distill.kd_intervals import N_BOOT, EvalPredictions, intervals_from_rows, kd_intervals
from gem_model.distill.student import Student, student_config
from gem_model.distill.teacher import FOUNDATION, path_applies, read_teacher_predictions, teacher_for
from gem_model.distill.trainer import (
    fit_student_calibrator,
    load_student,
    predict_student,
    preds_frame,
    save_student,
    train_student,
)
from gem_model.distill.warm_start import NO_SOURCE, warm_start
from gem_model.eval.metrics import metric_rows, read_oracle
from gem_model.models.registry import load_model
from gem_model.store import atomic
from gem_model.store.paths import models_dir, reports_dir
from gem_model.train.tracking import Tracker

DEFAULT_ARMS = ("labels_only", "standard_kd", "parameter_sharing")
DEFAULT_PATHS = ("direct", "hierarchical")
SPLITS = ("validation", "evaluation")
KD_EPS = 1e-4  # minimal NE gain of standard KD over labels-only for a defined KD effectiveness
REPORT_FILE = "distillation_report.json"


def _iter_students(
    arms: Sequence[str], paths: Sequence[str], seeds: Sequence[int], surfaces: Sequence[str] | None, *,
    teachers: Mapping[str, torch.nn.Module | str | Path] | None, teacher_predictions: pl.DataFrame | None,
    hp: dict[str, Any], roles: DayRoles, uri: str | None, tp_uri: str | None, oracle_uri: str | None,
    surfaces_config: SurfacesConfig, tracker: Tracker, device: str | None, precision: str,
    init_from: str | Path | None, kept: EvalPredictions, checkpoint_dir: Path | None = None,
) -> Iterable[tuple[dict[str, Any], Student, list[dict[str, Any]], dict[str, Any]]]:
    """Train every (surface, arm, path, seed); yield (key, model, metric rows, train info). kept:
    receives every student's per-row click predictions on E (the KD gains' bootstrap intervals)."""
    specs = {a: arm_spec(a) for a in arms}
    surfaces = list(surfaces or surfaces_config.names)
    features = load_features()
    dates = date_range(roles.student[0], roles.evaluation)
    student_days = date_range(*roles.student)
    hist_k = int(hp["student"].get("hist_k", 0))
    data = load_examples(dates, surfaces, hist_k=hist_k, uri=uri, surfaces_config=surfaces_config)

    needs_emb = any(s["representation"] for s in specs.values())
    wanted = sorted({t for s in surfaces for p in paths
                     if path_applies(p, s, surfaces_config) and (t := teacher_for(p, s, surfaces_config))})
    tp = None
    if any(s["kd"] != "none" for s in specs.values()):
        tp = teacher_predictions if teacher_predictions is not None else read_teacher_predictions(
            dates, wanted, uri=tp_uri, embeddings=needs_emb)
    # checkpoints written by gem_model.train.loop / save_domain_model
    modules = {k: v if isinstance(v, torch.nn.Module) else load_model(v)[0] for k, v in (teachers or {}).items()}
    d_model = next((int(modules[n].cfg.d_model) for n in [FOUNDATION, *sorted(modules)] if n in modules), 32)
    oracle_df = read_oracle([roles.validation, roles.evaluation], surfaces, uri=oracle_uri, missing_ok=True)

    for surface in surfaces:
        s_idx = surfaces_config.names.index(surface)
        sd = data.for_surface(s_idx)
        tasks = list(surfaces_config.get(surface).tasks)
        by_teacher: dict[str | None, StudentData] = {None: sd}
        adapters: dict[str, StudentAdapter] = {}
        for arm, spec in specs.items():
            for path in arm_paths(arm, paths):
                if not path_applies(path, surface, surfaces_config):
                    continue  # reported as not applicable by run_distillation
                teacher = teacher_for(path, surface, surfaces_config)
                if teacher not in by_teacher:
                    by_teacher[teacher] = attach_teacher(sd, tp, teacher, embeddings=needs_emb)
                tdata = by_teacher[teacher]
                adapter = None
                if spec["adapter"]:
                    if teacher not in adapters:
                        idx = [i for i, f in enumerate(features.dense) if f.name in hp["adapter"]["features"]]
                        adapters[teacher] = StudentAdapter(
                            idx, [features.dense[i].name for i in idx], hp["adapter"]["l2"], hp["adapter"]["iters"]
                        ).fit(tdata.on_dates(student_days), roles.adapter)
                    adapter = adapters[teacher]
                emb_dim = int(tdata.teacher_emb.shape[1]) if (spec["representation"] and tdata.teacher_emb is not None) else 0
                if spec["representation"] and not emb_dim:
                    raise ValueError(f"{teacher}: teacher_predictions carry no embeddings for the representation arm")
                train = tdata.on_dates(student_days)
                val = tdata.on_dates([roles.validation])
                ev = tdata.on_dates([roles.evaluation])
                for seed in seeds:
                    torch.manual_seed(seed)
                    cfg = student_config(hp["student"], features=features, teacher_d_model=d_model, surface=surface,
                                         tasks=tasks, aux_head=spec["kd"] == "aux", teacher_emb_dim=emb_dim)
                    cfg.update(arm=arm, path=path, teacher=teacher, seed=int(seed))
                    model = Student(cfg)
                    start = warm_start(model, init_from, train) if init_from is not None else {}
                    key = {"surface": surface, "arm": arm, "path": path, "seed": int(seed), "teacher": teacher}
                    prefix = f"{surface}/{arm}/{path}/s{seed}"
                    log = (lambda d, step=None, _p=prefix: tracker.log({f"{_p}/{k}": v for k, v in d.items()})
                           ) if tracker.enabled else None
                    info = train_student(model, train, val, arm, hp["train"], seed=int(seed), adapter=adapter,
                                         teacher_model=modules.get(teacher) if spec["share_tables"] else None, log=log,
                                         device=device, precision=precision,
                                         keep_start=start.get("warm_start") == "warm",
                                         checkpoint=student_checkpoint(checkpoint_dir, key) if checkpoint_dir else None)
                    info.update(start)
                    if len(val):  # its own map on E-1 (trainer.fit_student_calibrator): applied from here on
                        model.calibrator = fit_student_calibrator(model, val, roles.validation.isoformat())
                        info["calibration"] = model.calibrator.metadata()
                    if adapter is not None:
                        info["adapter"] = adapter.to_dict()
                    info["dates"] = {"train": [d.isoformat() for d in train.date_set],
                                     "validation": roles.validation.isoformat(), "evaluation": roles.evaluation.isoformat()}
                    rows = []
                    for split, part in (("validation", val), ("evaluation", ev)):
                        if len(part) == 0:
                            continue
                        preds = preds_frame(part, predict_student(model, part), surface,
                                             predict_student(model, part, calibrated=False))
                        if split == "evaluation" and "click" in tasks:
                            e = preds.filter(pl.col("click_mask"))
                            kept.add(surface, arm, path, int(seed), e["request_id"].to_numpy(), e["click"].to_numpy(),
                                     e["p_click"].to_numpy())
                        day = roles.validation if split == "validation" else roles.evaluation
                        rows += [{"arm": arm, "path": path, "split": split, "day": day.isoformat(),
                                  "surface": surface, "task": r["task"], "seed": int(seed), "ne": r["ne"],
                                  "auc": r["auc"], "calibration": r["calibration"],
                                  "ne_raw": r["ne_raw"], "calibration_raw": r["calibration_raw"],
                                  "oracle_ne": r["oracle_ne"], "kd_effectiveness": None, "n": r["n"],
                                  "positives": r["positives"], "teacher": teacher}
                                 for r in metric_rows(preds, oracle_df) if r["task"] in tasks]
                    tracker.log_metric_rows([{**r, "surface": f"{prefix}/{r['split']}"} for r in rows], "distill")
                    yield key, model, rows, info


NOT_APPLICABLE = "not applicable: the domain has one surface"


def not_applicable_rows(arms: Sequence[str], paths: Sequence[str], surfaces: Sequence[str],
                        surfaces_config: SurfacesConfig) -> list[dict[str, Any]]:
    """Report cells of paths that do not apply to a surface (no metrics, a `status` saying why)."""
    return [{"arm": arm, "path": path, "split": split, "surface": surface, "task": "click", "seed": None, "ne": None,
             "auc": None, "calibration": None, "oracle_ne": None, "ne_raw": None, "calibration_raw": None,
             "kd_effectiveness": None, "n": 0, "positives": 0, "teacher": None, "status": NOT_APPLICABLE}
            for surface in surfaces for arm in arms for path in arm_paths(arm, paths)
            if not path_applies(path, surface, surfaces_config) for split in SPLITS]


def kd_effectiveness(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill `kd_effectiveness` (+ kd_gain, kd_gain_standard) in place from click-task seed means,
    per (surface, split, path); see the module docstring for the ~0 denominator. Returns rows."""

    def mean_ne(arm: str, path: str, surface: str, split: str) -> float | None:
        v = [r["ne"] for r in rows if r["arm"] == arm and r["path"] == path and r["surface"] == surface
             and r["split"] == split and r["task"] == "click" and r["ne"] is not None and math.isfinite(r["ne"])]
        return float(np.mean(v)) if v else None

    for r in rows:
        r.setdefault("kd_effectiveness", None)
        if r["arm"] in (BASELINE, STANDARD) or r["task"] != "click":  # a click-task figure: not on conversion rows
            r["kd_effectiveness"] = None
            continue
        lo = mean_ne(BASELINE, "none", r["surface"], r["split"])
        std = mean_ne(STANDARD, r["path"], r["surface"], r["split"])
        arm = mean_ne(r["arm"], r["path"], r["surface"], r["split"])
        if lo is None or arm is None:
            continue
        r["kd_gain"] = lo - arm
        if std is None:
            continue
        r["kd_gain_standard"] = lo - std
        r["kd_effectiveness"] = (lo - arm) / (lo - std) if (lo - std) > KD_EPS else None
    return rows


def select_student(rows: list[dict[str, Any]], surface: str, incumbent: tuple[str, str] | None = None,
                   keep_within: float = 0.0) -> tuple[str, str]:
    """The (arm, path) with the lowest seed-mean click NE on the validation split (never E).

    incumbent: the (arm, path) of the surface's ACCEPTED student. It is kept unless the best pair beats
    it by more than `keep_within` NE: on one seed, pairs a few thousandths apart swap places from day to
    day, and each swap makes the production student start cold instead of warm."""
    scores: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["surface"] == surface and r["split"] == "validation" and r["task"] == "click" and r["ne"] is not None \
                and math.isfinite(r["ne"]):
            scores.setdefault((r["arm"], r["path"]), []).append(r["ne"])
    if not scores and incumbent:  # a validation day without a click there (a tiny surface) ranks nothing
        return tuple(incumbent)  # type: ignore[return-value]
    if not scores:
        raise ValueError(f"no validation click rows for surface {surface!r}")
    mean = {k: float(np.mean(v)) for k, v in scores.items()}
    best = min(mean, key=lambda k: (mean[k], k))
    incumbent = tuple(incumbent) if incumbent else None
    if incumbent in mean and mean[incumbent] - mean[best] <= keep_within:
        return incumbent
    return best


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (arm, path, split): click NE (mean over surfaces of seed means, and the seed spread)
    and KD effectiveness averaged over surfaces (None values skipped)."""
    out: dict[str, Any] = {}
    keys = sorted({(r["arm"], r["path"], r["split"]) for r in rows})
    for arm, path, split in keys:
        sub = [r for r in rows if (r["arm"], r["path"], r["split"]) == (arm, path, split) and r["task"] == "click"]
        per_surface = {}
        for s in sorted({r["surface"] for r in sub}):
            v = [r["ne"] for r in sub if r["surface"] == s and r["ne"] is not None and math.isfinite(r["ne"])]
            ke = [r["kd_effectiveness"] for r in sub if r["surface"] == s and r["kd_effectiveness"] is not None]
            ci = next((r for r in sub if r["surface"] == s and r.get("kd_gain_lo") is not None), None)
            per_surface[s] = {"ne_mean": float(np.mean(v)) if v else None, "ne_std": float(np.std(v)) if v else None,
                              "kd_effectiveness": ke[0] if ke else None,
                              **({"kd_gain": ci["kd_gain"], "kd_gain_ci": [ci["kd_gain_lo"], ci["kd_gain_hi"]],
                                  "kd_report": ci.get("kd_report"),
                                  "kd_effectiveness_ci": [ci.get("kd_effectiveness_lo"), ci.get("kd_effectiveness_hi")]}
                                 if ci is not None else {})}
        nes = [v["ne_mean"] for v in per_surface.values() if v["ne_mean"] is not None]
        kes = [v["kd_effectiveness"] for v in per_surface.values() if v["kd_effectiveness"] is not None]
        out[f"{arm}|{path}|{split}"] = {
            "arm": arm, "path": path, "split": split,
            "click_ne_mean": float(np.mean(nes)) if nes else None,
            "kd_effectiveness_mean": float(np.mean(kes)) if kes else None,
            "surfaces": per_surface,
        }
    return out


def write_report(rows: list[dict[str, Any]], path: str | Path | None = None,
                 incumbents: Mapping[str, tuple[str, str]] | None = None, keep_within: float = 0.0, *,
                 teachers: Mapping[str, str] | None = None, selection_from: Mapping[str, Any] | None = None,
                 preset: str | None = None) -> Path:
    """reports/distillation_report.json: rows, summary, and the (arm, path) selected per surface
    (`select_student`, keeping a surface's incumbent (arm, path) within `keep_within`).

    teachers: {teacher name: version} the rows were trained with. selection_from: an earlier report
    whose selection stands ("selected", "selection"): the daily report between teacher changes trains
    only the labels_only floor, so it has nothing to select from. preset: the students.yaml preset its students
    trained with (the production students train with it too)."""
    path = Path(path) if path else reports_dir() / REPORT_FILE
    surfaces = sorted({r["surface"] for r in rows})
    incumbents = incumbents or {}
    if selection_from is not None:
        selected = {s: (v["arm"], v["path"]) for s, v in selection_from["selected"].items()}
        selection = dict(selection_from["selection"])
    else:
        selected = {s: select_student(rows, s, incumbents.get(s), keep_within) for s in surfaces}
        days = sorted({r["day"] for r in rows if r.get("split") == "validation" and r.get("day")})
        # what made it: the validation day (E-1) it ranked on, the arms it compared, the teachers' versions
        selection = {"on": days[-1] if days else None, "arms": sorted({r["arm"] for r in rows}),
                     "teachers": dict(teachers or {})}
    doc = {
        "rows": rows,
        "summary": summarize(rows),
        "kd_intervals": intervals_from_rows(rows),  # gains over labels_only on E with paired bootstrap CIs
        "selected": {s: {"arm": a, "path": p, "kept_accepted": incumbents.get(s) == (a, p)}
                     for s, (a, p) in selected.items()},
        "selection": selection,
        "arms": sorted({r["arm"] for r in rows}),  # trained for this report
        "keep_accepted_within": keep_within,
        "preset": preset,
    }
    return atomic.write_json(path, doc)


def run_distillation(
    arms: Sequence[str] = DEFAULT_ARMS,
    paths: Sequence[str] = DEFAULT_PATHS,
    seeds: Sequence[int] = (0,),
    surfaces: Sequence[str] | None = None,
    *,
    teachers: Mapping[str, torch.nn.Module | str | Path] | None = None,
    teacher_predictions: pl.DataFrame | None = None,
    preset: str = "small",
    overrides: dict[str, Any] | None = None,
    roles: DayRoles | None = None,
    uri: str | None = None,
    tp_uri: str | None = None,
    oracle_uri: str | None = None,
    save_root: str | Path | None = None,
    tracking_group: str | None = None,
    surfaces_config: SurfacesConfig | None = None,
    on_student: Callable[[dict[str, Any], Student, list[dict[str, Any]], dict[str, Any]], None] | None = None,
    device: str | None = None,
    precision: str = "fp32",
    init_from: str | Path | None = None,
    n_boot: int = N_BOOT,
    checkpoint_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Train and evaluate every arm x path x surface x seed; return the report rows (see module doc).

    arms / paths: names from arms.ARMS / ("direct", "hierarchical"); labels_only runs once per
    surface on path "none". teachers: {"foundation" | "domain:<name>": module or checkpoint path},
    needed for parameter_sharing (the tables copied) and, if students.yaml leaves d_model null, for
    the student width. teacher_predictions: a preloaded frame (default: read the table at tp_uri).
    roles: the calendar's day roles (default load_calendar().roles()). uri / tp_uri / oracle_uri:
    training_examples / teacher_predictions / oracle tables (default: the lake's). save_root: save
    every student under <save_root>/<surface>/<arm>-<path>-s<seed>/. tracking_group: W&B group (the
    teacher's run). on_student(key, model, rows, info): called after each student. device / precision:
    where and in which autocast precision the students train (the accelerator resource's; default:
    the CPU in fp32); each student is handed back on the CPU. init_from: a saved student (version
    directory) every student starts from when compatible (`warm_start`; the production student's last
    ACCEPTED version), its outcome in info["warm_start"]. n_boot: bootstrap resamples of the KD
    gains' intervals on E (gem_model.distill.kd_intervals; fields kd_gain_lo/hi, kd_report, ...). checkpoint_dir:
    where each student keeps its resumable state (`student_checkpoint`): a call that died continues each student
    from it when called again with the same directory."""
    surfaces_config = surfaces_config or load_surfaces()
    roles = roles or load_calendar().roles()
    hp = load_student_preset(preset, overrides=overrides)
    tracker = Tracker(project="gem", name="distillation", group=tracking_group, job_type="distill",
                      config={"arms": list(arms), "paths": list(paths), "seeds": list(seeds), **hp})
    rows: list[dict[str, Any]] = []
    kept = EvalPredictions()
    t0 = time.perf_counter()
    try:
        for key, model, r, info in _iter_students(
            arms, paths, seeds, surfaces, teachers=teachers, teacher_predictions=teacher_predictions, hp=hp,
            roles=roles, uri=uri, tp_uri=tp_uri, oracle_uri=oracle_uri, surfaces_config=surfaces_config,
            tracker=tracker, device=device, precision=precision, init_from=init_from, kept=kept,
            checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        ):
            rows.extend(r)
            if save_root is not None:
                d = Path(save_root) / key["surface"] / f"{key['arm']}-{key['path']}-s{key['seed']}"
                save_student(model, d, {"rows": r, "train": {k: v for k, v in info.items() if k != "losses"}},
                             {"key": key, "hyperparameters": hp, "wandb": tracker.info()})
            if on_student is not None:
                on_student(key, model, r, info)
        rows.extend(not_applicable_rows(arms, paths, surfaces or surfaces_config.names, surfaces_config))
        kd_effectiveness(rows)
        if BASELINE in arms:  # paired bootstrap intervals of every gain over labels_only on E
            kd_intervals(rows, kept, n_boot=n_boot)
        tracker.summary({"distill/seconds": time.perf_counter() - t0, "distill/students": len({
            (r["surface"], r["arm"], r["path"], r["seed"]) for r in rows})})
    finally:
        tracker.finish()
    return rows


def student_checkpoint(directory: str | Path, key: dict[str, Any]) -> Path:
    """The resumable state of one student of a distillation (key: surface, arm, path, seed) under `directory`."""
    return Path(directory) / f"checkpoint-{key['surface']}-{key['arm']}-{key['path']}-s{key['seed']}.pt"


def train_production_student(
    surface: str,
    arm: str,
    path: str,
    *,
    seed: int = 0,
    version: str | None = None,
    root: str | Path | None = None,
    export: bool = True,
    **kw: Any,
) -> dict[str, Any]:
    """Train the production student of `surface` with the selected (arm, path) and save it under
    <root or $GEM_HOME/models/students>/<surface>/<version>/ (model.pt, config.json, metrics.json,
    student.pt2 + student.pt2.json), its resumable state beside them while it trains (a call that died continues
    from it when called again with the same version). kw: as run_distillation (teachers, teacher_predictions,
    preset, overrides, roles, uri, tp_uri, oracle_uri, tracking_group, surfaces_config, device, precision,
    init_from: the last ACCEPTED student of the surface to warm-start from).
    Returns {"surface", "arm", "path", "version", "model_dir", "export", "rows", "train", "checkpoint"}."""
    version = version or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = Path(root) / surface if root is not None else models_dir("students", surface)
    out: dict[str, Any] = {}

    def keep(key: dict[str, Any], model: Student, rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
        d = base / version
        meta = {"rows": rows, "train": {**NO_SOURCE, **{k: v for k, v in info.items() if k != "losses"}}, "key": key}
        save_student(model, d, meta, {"key": key, "version": version})
        out.update(surface=surface, arm=arm, path=path, version=version, model_dir=str(d), rows=rows,
                   train=meta["train"], export=str(export_student(model, d / "student.pt2")) if export else None,
                   checkpoint=str(student_checkpoint(d, key)))

    # labels_only: path "none" always
    run_distillation([arm], [path], [seed], [surface], on_student=keep, checkpoint_dir=base / version, **kw)
    return out


def score_student(
    model_dir: str | Path,
    day: dt.date,
    *,
    teacher_predictions: pl.DataFrame | None = None,
    uri: str | None = None,
    tp_uri: str | None = None,
    oracle_uri: str | None = None,
) -> list[dict[str, Any]]:
    """Metric rows of a saved student on `day`: how the quality gate re-scores the ACCEPTED student
    when the evaluation day moved. Its teacher's predictions of that day feed the representation arms."""
    surfaces_config = load_surfaces()
    model = load_student(model_dir).eval()
    cfg = model.cfg
    surface, teacher = cfg["surface"], cfg.get("teacher")
    data = load_examples([day], [surface], hist_k=int(cfg.get("hist_k", 0)), uri=uri, surfaces_config=surfaces_config)
    data = data.for_surface(surfaces_config.names.index(surface))
    if teacher:
        embeddings = bool(cfg.get("teacher_emb_dim"))
        tp = teacher_predictions if teacher_predictions is not None else read_teacher_predictions(
            [day], [teacher], uri=tp_uri, embeddings=embeddings)
        data = attach_teacher(data, tp, teacher, embeddings=embeddings)
    oracle_df = read_oracle([day], [surface], uri=oracle_uri, missing_ok=True)
    raw = predict_student(model, data, calibrated=False) if getattr(model, "calibrator", None) is not None else None
    preds = preds_frame(data, predict_student(model, data), surface, raw)
    return [r for r in metric_rows(preds, oracle_df) if r["task"] in cfg.get("tasks", TASKS)]
