"""Student variants side by side: the choice on E-1, and (`--evaluate`) the chosen pair on E.

    GEM_HOME=<home> PYTHONPATH=. python bench/student_search.py --variants layer_norm standardized_wide \
        [--arms labels_only standard_kd] [--seeds 0 1 2] [--out <dir>] [--evaluate]

Trains every (variant, arm, surface, seed) with gem_model.distill.run_distillation on the lake of GEM_HOME
(students up to E-2 of its calendar, the epoch kept on E-1), on the direct path (standard KD reads the
foundation's rows of teacher_predictions; parameter sharing the ACCEPTED foundation's tables), and prints the
seed-mean click NE on E-1 per surface: the only input to a choice. Students are saved under --out/<variant>/.
`--evaluate` (after the choice) re-scores the saved students on E and prints, per arm and surface, every
variant's seed-mean NE minus the first variant's, with a 95% interval from paired Poisson resamples of E's rows
(the same resamples for every variant and seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

# `python bench/student_search.py` puts bench/ first on sys.path, where bench/kernels.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gem_model.config import load_calendar, load_surfaces  # noqa: E402
from gem_model.distill.arms import arm_spec  # noqa: E402
from gem_model.distill.dataset import attach_teacher, load_examples  # noqa: E402
from gem_model.distill.run import run_distillation  # noqa: E402
from gem_model.distill.teacher import read_teacher_predictions  # noqa: E402
from gem_model.distill.trainer import load_student, predict_student  # noqa: E402
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402

# name -> overrides of assets/models/students.yaml's preset
VARIANTS: dict[str, dict] = {
    "layer_norm": {"student": {"dense_inputs": "layer_norm", "wide": False}},
    "standardized": {"student": {"dense_inputs": "standardized", "wide": False}},
    "standardized_wide": {"student": {"dense_inputs": "standardized", "wide": True}},
    "standardized_wide_emb_lr_0.01": {"student": {"dense_inputs": "standardized", "wide": True},
                                      "train": {"emb_lr": 0.01}},
    "standardized_wide_lr_0.002": {"student": {"dense_inputs": "standardized", "wide": True}, "train": {"lr": 0.002}},
    "standardized_wide_5_epochs": {"student": {"dense_inputs": "standardized", "wide": True},
                                   "train": {"epochs": 5, "max_steps": 420}},
}


def _accepted_foundation() -> str | None:
    from gem_model.models.registry import read_accepted, resolve_checkpoint

    found = read_accepted("foundation_model", None)
    return str(resolve_checkpoint(found)) if found is not None else None


def search(variants: list[str], arms: list[str], seeds: list[int], out: Path, preset: str) -> list[dict]:
    teacher = _accepted_foundation()
    rows = []
    for name in variants:
        got = run_distillation(arms, ["direct"], seeds, preset=preset, overrides=VARIANTS[name],
                               teachers={"foundation": teacher} if teacher else None, save_root=out / name,
                               n_boot=10)
        rows += [{**r, "variant": name} for r in got if r.get("task") == "click" and r.get("ne") is not None]
    (out / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def e1_table(rows: list[dict], variants: list[str], arms: list[str]) -> str:
    surfaces = load_surfaces().names
    lines = ["| variant | arm | " + " | ".join(surfaces) + " | mean |", "|---|---|" + "---|" * (len(surfaces) + 1)]
    for name in variants:
        for arm in arms:
            cells = []
            for s in surfaces:
                ne = [r["ne"] for r in rows if r["variant"] == name and r["arm"] == arm and r["surface"] == s
                      and r["split"] == "validation"]
                cells.append(float(np.mean(ne)) if ne else float("nan"))
            lines.append(f"| {name} | {arm} | " + " | ".join(f"{c:.4f}" for c in cells) + f" | {np.nanmean(cells):.4f} |")
    return "\n".join(lines)


def evaluate(variants: list[str], arms: list[str], seeds: list[int], out: Path, n_boot: int = 1000) -> str:
    """Every variant minus the first on E, per arm and surface, from paired resamples of E's rows."""
    roles = load_calendar().roles()
    surfaces = load_surfaces()
    base = variants[0]
    rows: dict[str, list[str]] = {arm: [] for arm in arms}
    pooled: dict[tuple[str, str], list[tuple[float, float, np.ndarray]]] = {}  # (arm, variant) -> (clicks, diff, samples)
    for s in surfaces.names:  # E's rows of a surface read once, and its teacher predictions once, for every arm
        data = load_examples([roles.evaluation], [s], hist_k=64, uri=table_uri("training_examples"),
                             surfaces_config=surfaces).for_surface(surfaces.names.index(s))
        m = data.label_mask[:, 0].numpy()
        y = data.labels[:, 0].numpy()[m].astype(np.float64)
        with_teacher = {}
        if any(a != "labels_only" for a in arms):  # the representation arms read the teacher's summary embedding
            tp = read_teacher_predictions([roles.evaluation], ["foundation"], uri=table_uri("teacher_predictions"),
                                          embeddings=True)
            with_teacher = {e: attach_teacher(data, tp, "foundation", embeddings=e) for e in (False, True)}
        for arm in arms:
            path = "none" if arm == "labels_only" else "direct"
            part = data if path == "none" else with_teacher[bool(arm_spec(arm)["representation"])]
            preds = {}
            for v in variants:
                for seed in seeds:
                    model = load_student(out / v / s / f"{arm}-{path}-s{seed}").eval()
                    k = int(model.hist_k)  # loaded with 64, most recent first: the student's last k
                    preds[(v, seed)] = predict_student(model, replace(part, hist_ids=part.hist_ids[:, :k]))[m, 0]
            boot = bootstrap_ne(y, {f"{v}|{sd}": p for (v, sd), p in preds.items()}, n_boot=n_boot,
                                seed=surfaces.names.index(s))
            point = {v: float(np.mean([normalized_entropy(y, preds[(v, sd)]) for sd in seeds])) for v in variants}
            samples = {v: np.mean([boot[f"{v}|{sd}"] for sd in seeds], axis=0) for v in variants}
            cells = []
            for v in variants[1:]:
                diff = samples[v] - samples[base]
                pooled.setdefault((arm, v), []).append((float(y.sum()), point[v] - point[base], diff))
                lo, hi = interval(diff)
                cells.append(f"{point[v] - point[base]:+.4f} [{lo:+.4f}, {hi:+.4f}]")
            rows[arm].append(f"| {arm} | {s} | {int(y.sum()):,} | " + " | ".join(f"{point[v]:.4f}" for v in variants)
                             + " | " + " | ".join(cells) + " |")
    lines = ["| arm | surface | clicks | " + " | ".join(f"{v} NE" for v in variants) + " | "
             + " | ".join(f"{v} - {base} [95%]" for v in variants[1:]) + " |",
             "|---|---|---|" + "---|" * (2 * len(variants) - 1)]
    for arm in arms:
        cells = []  # pooled: the clicks-weighted mean of the surfaces' differences, on the same resamples
        for v in variants[1:]:
            w = np.array([c for c, _, _ in pooled[(arm, v)]])
            lo, hi = interval(sum(c * smp for c, _, smp in pooled[(arm, v)]) / w.sum())
            point = float(np.dot(w, [d for _, d, _ in pooled[(arm, v)]]) / w.sum())
            cells.append(f"{point:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        lines += rows[arm] + [f"| {arm} | pooled (clicks-weighted) | | " + " | ".join("" for _ in variants) + " | "
                              + " | ".join(cells) + " |"]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--arms", nargs="+", default=["labels_only"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--out", default=None, help="where the students are saved (default: a temporary folder)")
    p.add_argument("--evaluate", action="store_true", help="also score the saved students on E (after the choice)")
    p.add_argument("--evaluate-only", action="store_true", help="score the students saved under --out on E")
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="student_search_"))
    out.mkdir(parents=True, exist_ok=True)
    if not a.evaluate_only:
        rows = search(a.variants, a.arms, a.seeds, out, a.preset)
        print(f"E-1 = {load_calendar().roles().validation}, click NE, mean of seeds {a.seeds} (students in {out})\n")
        print(e1_table(rows, a.variants, a.arms))
    if a.evaluate or a.evaluate_only:
        print(f"\nE = {load_calendar().roles().evaluation}, click NE, mean of seeds {a.seeds}\n")
        print(evaluate(a.variants, a.arms, a.seeds, out))


if __name__ == "__main__":
    main()
