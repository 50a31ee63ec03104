"""Paired bootstrap intervals of the KD gains on E (click task), from the students' per-row predictions.

Per surface, one Poisson bootstrap over the rows of E (`gem_model.eval.metrics.bootstrap_ne`: the same
resamples for every arm, path and seed, so differences are paired) gives, from seed means:
    gain(arm, path)   = NE(labels_only) - NE(arm, path)                  with its 95% interval
    effectiveness     = gain(arm, path) / gain(standard_kd, path)         with its 95% interval
The ratio is reported only where standard KD's own gain interval lies above 0. Otherwise (0 inside
it, or standard KD worse than labels-only) the ratio's sign and size mean nothing: the two gains are
reported instead (kd_report = "two gains").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gem_model.distill.arms import BASELINE, STANDARD
from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy

N_BOOT = 1000
RATIO, TWO_GAINS = "ratio", "two gains"
FULL_RECIPE = ("parameter_sharing", "hierarchical")  # the seed article's full recipe
# an interval cell's fields -> the evaluation click row's, in the rows' order (kd_intervals)
ROW_KEYS = {"gain": "kd_gain", "gain_lo": "kd_gain_lo", "gain_hi": "kd_gain_hi", "report": "kd_report",
            "effectiveness_lo": "kd_effectiveness_lo", "effectiveness_hi": "kd_effectiveness_hi",
            "standard_gain_lo": "kd_gain_standard_lo", "standard_gain_hi": "kd_gain_standard_hi"}


class EvalPredictions:
    """Per surface: the click labels of E (masked rows, in the students' row order) and every
    student's p_click on them, keyed (arm, path, seed). Float32: a few MB for the whole grid."""

    def __init__(self) -> None:
        self.labels: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # surface -> (request_ids, y)
        self.preds: dict[str, dict[tuple[str, str, int], np.ndarray]] = {}

    def add(self, surface: str, arm: str, path: str, seed: int, request_ids: np.ndarray, y: np.ndarray,
            p: np.ndarray) -> None:
        ids = np.asarray(request_ids)
        if surface not in self.labels:
            self.labels[surface] = (ids, np.asarray(y, dtype=np.float64))
            self.preds[surface] = {}
        elif not np.array_equal(self.labels[surface][0], ids):  # the paired bootstrap needs the same rows
            raise ValueError(f"{surface}: {arm}/{path} seed {seed} was evaluated on other rows of E than the first arm")
        self.preds[surface][(arm, path, int(seed))] = np.asarray(p, dtype=np.float32)


def surface_intervals(y: np.ndarray, preds: dict[tuple[str, str, int], np.ndarray], *, n_boot: int = N_BOOT,
                      seed: int = 0) -> dict[str, Any]:
    """{"n", "positives", "arms": {"arm|path": {gain, gain_lo, gain_hi, report, effectiveness,
    effectiveness_lo, effectiveness_hi, standard_gain, standard_gain_lo, standard_gain_hi}}}."""
    boot = bootstrap_ne(y, {f"{a}|{p}|{s}": v for (a, p, s), v in preds.items()}, n_boot=n_boot, seed=seed)
    point_s: dict[tuple[str, str], list[float]] = {}
    samples_s: dict[tuple[str, str], list[np.ndarray]] = {}
    for (arm, path, seed), p in preds.items():  # seed means of NE and of its resamples
        point_s.setdefault((arm, path), []).append(normalized_entropy(y, p))
        samples_s.setdefault((arm, path), []).append(boot[f"{arm}|{path}|{seed}"])
    point = {k: float(np.mean(v)) for k, v in point_s.items()}
    samples = {k: np.mean(np.stack(v), axis=0) for k, v in samples_s.items()}
    base = next((k for k in point if k[0] == BASELINE), None)
    out: dict[str, Any] = {"n": int(len(y)), "positives": int(np.sum(y)), "n_boot": n_boot, "arms": {}}
    if base is None:
        return out
    gains = {k: (point[base] - point[k], samples[base] - samples[k]) for k in point if k != base}
    for (arm, path), (g, gs) in sorted(gains.items()):
        lo, hi = interval(gs)
        cell: dict[str, Any] = {"gain": g, "gain_lo": lo, "gain_hi": hi}
        std = gains.get((STANDARD, path))
        if arm != STANDARD and std is not None:
            s_lo, s_hi = interval(std[1])
            cell.update(standard_gain=std[0], standard_gain_lo=s_lo, standard_gain_hi=s_hi)
            if s_lo > 0:  # standard KD gains measurably: the ratio means something
                ratio = gs / std[1]
                e_lo, e_hi = interval(ratio[np.isfinite(ratio)])
                cell.update(report=RATIO, effectiveness=g / std[0], effectiveness_lo=e_lo, effectiveness_hi=e_hi)
            else:
                cell.update(report=TWO_GAINS, effectiveness=None, effectiveness_lo=None, effectiveness_hi=None)
        out["arms"][f"{arm}|{path}"] = cell
    return out


def kd_intervals(rows: list[dict[str, Any]], kept: EvalPredictions, *, n_boot: int = N_BOOT) -> dict[str, Any]:
    """Intervals per surface (`surface_intervals`), also written into the evaluation-split click rows
    of each (arm, path, surface): kd_gain, kd_gain_lo/hi, kd_report, kd_effectiveness_lo/hi."""
    out = {s: surface_intervals(kept.labels[s][1], kept.preds[s], n_boot=n_boot) for s in sorted(kept.labels)}
    for r in rows:
        if r.get("split") != "evaluation" or r.get("task") != "click" or r.get("surface") not in out:
            continue
        cell = out[r["surface"]]["arms"].get(f"{r['arm']}|{r['path']}")
        if cell is None:
            continue
        r.update({rk: cell[ck] for ck, rk in ROW_KEYS.items() if ck in cell})
        if cell.get("report") == TWO_GAINS:  # no ratio where standard KD's gain is not shown above 0
            r["kd_effectiveness"] = None
    return out


def intervals_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-surface structure of `kd_intervals` again, from the fields it wrote into the rows
    (what write_report and the tables read)."""
    out: dict[str, Any] = {}
    for r in rows:
        if r.get("split") != "evaluation" or r.get("task") != "click" or r.get("kd_gain_lo") is None:
            continue
        cell = {"gain": r["kd_gain"], "gain_lo": r["kd_gain_lo"], "gain_hi": r["kd_gain_hi"]}
        if r.get("kd_report"):
            cell.update(report=r["kd_report"], effectiveness=r.get("kd_effectiveness") if r["kd_report"] == RATIO else None,
                        effectiveness_lo=r.get("kd_effectiveness_lo"), effectiveness_hi=r.get("kd_effectiveness_hi"),
                        standard_gain=r.get("kd_gain_standard"), standard_gain_lo=r.get("kd_gain_standard_lo"),
                        standard_gain_hi=r.get("kd_gain_standard_hi"))
        out.setdefault(r["surface"], {"arms": {}})["arms"][f"{r['arm']}|{r['path']}"] = cell
    return {s: {"arms": dict(sorted(v["arms"].items()))} for s, v in sorted(out.items())}


def _f(v: float | None, fmt: str = "+.4f") -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, fmt)


def intervals_markdown(intervals: dict[str, Any]) -> str:
    """The KD table of `make eval`: gain over labels_only per arm and path with its interval, and the
    effectiveness ratio, or the two gains where standard KD's gain interval does not lie above 0."""
    lines = [
        "Click NE on E: gain = NE(labels_only) - NE(arm) of seed means, 95% paired bootstrap interval "
        "(rows of E resampled, the same resamples for every arm of a surface); effectiveness = gain / "
        "standard_kd's gain on the same path, given only where standard KD's own gain interval lies above 0 "
        "(otherwise the two gains). Full recipe: parameter_sharing on the hierarchical path.",
        "",
        "| surface | arm | path | gain | 95% CI | effectiveness | 95% CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, v in intervals.items():
        for key, c in v["arms"].items():
            arm, path = key.split("|")
            name = f"**{arm}**" if (arm, path) == FULL_RECIPE else arm
            if c.get("report") == RATIO:
                eff = f"{_f(c['effectiveness'], '.2f')} | [{_f(c['effectiveness_lo'], '.2f')}, {_f(c['effectiveness_hi'], '.2f')}]"
            elif c.get("report") == TWO_GAINS:
                eff = (f"two gains: {_f(c['gain'])} vs standard_kd {_f(c['standard_gain'])} "
                       f"[{_f(c['standard_gain_lo'])}, {_f(c['standard_gain_hi'])}] | ")
            else:
                eff = "- | -"
            lines.append(f"| {s} | {name} | {path} | {_f(c['gain'])} | [{_f(c['gain_lo'])}, {_f(c['gain_hi'])}] | {eff} |")
    return "\n".join(lines) + "\n"
