"""How many of a week's 28 (day, surface) calibration cells does a model pass that has no bias of its own?

Issue 24's yardstick (gem_pipelines.day_report): on each day D of `make week` and each surface, the model's
calibration against the truth (mean p / mean true p, behind a map fitted on D-2 and D-1) passes when it is no
further from 1 than the oracle's own probabilities behind a map fitted the same way on the same days; the goal
asks for 20 of 28. Both maps fit the same clicks, so both inherit the same fitting noise, and what decides a cell
is the small difference between the two maps' errors. Unless that difference leans against the oracle's error,
a model passes a cell about as often as it fails it.

This bench measures it on a world where the answer is known: per surface and day, true click probabilities
(logit-normal around the surface's rate), clicks drawn from them, an oracle that reads the truth and a model
that reads it with noise (`--noise`, logit sd) and, optionally, a bias that climbs by `--drift` logits a day
(what a stale model does between retrains). Maps by the foundation's rule (gem_model.models.calibration.
DEFAULT_CALIBRATION, fit_calibrator), on D-2 and D-1, scoring D = day 3..9 of nine, as `make week` scores its
seven days. Rows and clicks per surface and day default to the evaluation world's (assets/simulator_eval.yaml:
impressions a day times each surface's traffic share; `--clicks-per-day`, about what its week logged).

    PYTHONPATH=. python bench/calibration_yardstick.py [--weeks 200] [--noise 0.05 0.5 1.0] [--drift 0 0.01]

Per (noise, drift): the model's NE and the oracle's (behind their maps), the mean cells passed of 28 with its 5-95% range over the
simulated weeks, the share of weeks with at least 20, and the mean abs(calibration - 1) of model and oracle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

# bench/kernels.py would shadow the kernels package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import ASSETS_DIR, load_simulator  # noqa: E402
from gem_model.eval.metrics import normalized_entropy  # noqa: E402
from gem_model.models.calibration import DEFAULT_CALIBRATION, fit_calibrator  # noqa: E402
from gem_pipelines.metadata import md_grid  # noqa: E402

DAYS = 9  # D-2 and D-1 of the first scored day, then the seven scored days
GOAL = 20  # of 28 cells (issue 24)


def eval_world_rows() -> dict[str, int]:
    """Rows a day per surface of the evaluation world: impressions a day times the surface's traffic share."""
    cfg = load_simulator(ASSETS_DIR / "simulator_eval.yaml")
    return {s: round(cfg.impressions_per_day * share) for s, share in (cfg.traffic_share or {}).items()}


def _fit_rows(surface: np.ndarray, y: np.ndarray, p: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"surface": surface, "click": y, "p_click": p}).with_columns(
        click_mask=pl.lit(True), conversion=pl.lit(0.0), conversion_mask=pl.lit(False), p_conversion=pl.lit(0.5))


def _mapped(fit: pl.DataFrame, surface: np.ndarray, p: np.ndarray, surfaces: list[str]) -> np.ndarray:
    """`p` behind the map fitted on `fit` by the foundation's rule."""
    cal = fit_calibrator(fit, surfaces, min_positives=DEFAULT_CALIBRATION["min_positives"],
                         shrink_positives=DEFAULT_CALIBRATION["shrink_positives"], prior="pooled",
                         level_positives=DEFAULT_CALIBRATION["level_positives"])
    return cal.apply_probs(p, surface)


def week(rng: np.random.Generator, rows: dict[str, int], clicks: float, spread: float, noise: float,
         drift: float) -> dict[str, np.ndarray]:
    """One simulated week: per scored cell the model's and the oracle's calibration against the truth, and
    the NE of both behind their maps on the scored days."""
    surfaces = list(rows)
    days = []
    for d in range(DAYS):
        parts = []
        for s, n in rows.items():
            z = np.log(clicks / n / (1 - clicks / n)) + spread * rng.standard_normal(n)
            truth = 1 / (1 + np.exp(-z))
            model = 1 / (1 + np.exp(-(z + noise * rng.standard_normal(n) + drift * d)))
            parts.append((np.full(n, s), (rng.random(n) < truth).astype(np.float64), truth, model))
        days.append(tuple(np.concatenate(c) for c in zip(*parts, strict=True)))
    cal_m, cal_o, ne_m, ne_o = [], [], [], []
    for d in range(2, DAYS):
        fit = [np.concatenate(c) for c in zip(days[d - 2], days[d - 1], strict=True)]
        fit_o, fit_m = _fit_rows(fit[0], fit[1], fit[2]), _fit_rows(fit[0], fit[1], fit[3])
        surface, y, truth, model = days[d]
        mapped_o, mapped_m = _mapped(fit_o, surface, truth, surfaces), _mapped(fit_m, surface, model, surfaces)
        for s in surfaces:
            on = surface == s
            cal_o.append(float(mapped_o[on].mean() / truth[on].mean()))
            cal_m.append(float(mapped_m[on].mean() / truth[on].mean()))
        ne_m.append(normalized_entropy(y, mapped_m))
        ne_o.append(normalized_entropy(y, mapped_o))
    return {"m": np.array(cal_m), "o": np.array(cal_o), "ne_m": np.array(ne_m), "ne_o": np.array(ne_o)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weeks", type=int, default=200)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.05, 0.5, 1.0],
                    help="the model's logit noise around the truth (0: the oracle itself)")
    ap.add_argument("--drift", type=float, nargs="+", default=[0.0, 0.01], help="the model's bias, logits a day")
    ap.add_argument("--spread", type=float, default=1.2, help="sd of the true logits around the surface's rate")
    ap.add_argument("--clicks-per-day", type=float, default=300.0, help="expected clicks of a surface a day")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows = eval_world_rows()
    out = []
    for noise in a.noise:
        for drift in a.drift:
            rng = np.random.default_rng(a.seed)
            weeks = [week(rng, rows, a.clicks_per_day, a.spread, noise, drift) for _ in range(a.weeks)]
            passed = np.array([int((np.abs(w["m"] - 1) <= np.abs(w["o"] - 1)).sum()) for w in weeks])
            out.append({"noise": noise, "drift a day": drift,
                        "model NE": round(float(np.mean([w["ne_m"].mean() for w in weeks])), 4),
                        "oracle NE": round(float(np.mean([w["ne_o"].mean() for w in weeks])), 4),
                        "cells passed (of 28)": round(float(passed.mean()), 1),
                        "5-95%": f"{int(np.percentile(passed, 5))}-{int(np.percentile(passed, 95))}",
                        f"weeks with >= {GOAL}": f"{(passed >= GOAL).mean():.1%}",
                        "model abs(cal - 1)": round(float(np.mean([np.abs(w['m'] - 1).mean() for w in weeks])), 4),
                        "oracle abs(cal - 1)": round(float(np.mean([np.abs(w['o'] - 1).mean() for w in weeks])), 4)})
            print(out[-1], flush=True)
    print(f"\n{a.weeks} simulated weeks a row; rows a day {rows}, {a.clicks_per_day:g} clicks a surface a day, "
          f"spread {a.spread:g}\n")
    print(md_grid(list(out[0]), [list(r.values()) for r in out], fmt=str).value)


if __name__ == "__main__":
    main()
