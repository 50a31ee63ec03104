"""Where the oracle's edge lives: click NE on E of the oracle with one latent factor taken away.

    PYTHONPATH=. GEM_SIMULATOR=eval python bench/oracle_decomposition.py [--lookbacks 1 2]   # the world of `make eval`

The simulator's click logit is a sum of terms (gem_pipelines/data/simulator.py): ad and advertiser
quality, position, device, hour (all visible to a model through ids and features), the user's
propensity (a per-user offset: visible only by memorising each user's few clicks) and gamma x the
user's current interest in the ad's topic (visible only through the topics of the user's history,
which a model must first learn from which items share histories). Each variant removes terms from
the true logit and refits a per-surface logistic map (intercept + one weight per input) on E-1,
then scores E, so every row is a model that knows the rest exactly:

- oracle: the true probability (the floor of every report);
- no propensity / no interest / neither: the true logit without those terms;
- interest from history topics: "no interest" plus the log share of the candidate's topic among the
  topics of the user's organic items of the 7 days before (every item's true topic known): what the
  history can say about the interest when the topics are known perfectly (with --lookbacks, also on fewer
  days: how much of it a shorter history keeps);
- blind to the own quality of ads launched that day (a world with churn): the true logit less the own
  quality draw of every ad launched on the scored day (its advertiser's quality, objective and format stay),
  with a flag for those ads: no log says more of a new ad before its own clicks come in.

A second table gives each variant's share of the oracle's gap on the rows of the ads launched on E (a
world with churn): which missing piece holds a model down on the new ads.

A third table gives the oracle's own click NE and calibration (sum of true probabilities / clicks)
per surface on each day of the calendar: how far one day's click count alone moves a perfect
model's calibration (the goal of issue 9 asks 0.95-1.05 on E of every model).

The days are simulated again from the world's seed (the lake holds the same rows, less the
corrupted records); nothing is trained, E is only scored.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import load_calendar, load_simulator, load_surfaces  # noqa: E402
from gem_model.eval.metrics import normalized_entropy  # noqa: E402
from gem_pipelines.data import simulator as sim  # noqa: E402

LOOKBACK = 7
NEW_BLIND = "blind to the own quality of ads launched that day"
PRIOR = 0.5  # add-one-half smoothing of the topic counts


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def fit_logistic(x: np.ndarray, y: np.ndarray, iters: int = 30, l2: float = 1e-6) -> np.ndarray:
    """Newton's method for a logistic regression with an intercept; returns the weights."""
    x = np.column_stack([np.ones(len(x)), x])
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def _apply(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-(np.column_stack([np.ones(len(x)), x]) @ w)))


def _day(cfg, surfaces, date: dt.date) -> dict[str, np.ndarray]:
    """Every surface's impressions of `date` with the pieces of their true logit."""
    parts = []
    for s in surfaces.names:
        imp, _ = sim.simulate_day_frames(cfg, surfaces, s, date)
        users, ads = imp["user_id"].to_numpy(), imp["ad_id"].to_numpy()
        parts.append({
            "surface": np.full(imp.height, s), "user": users, "ad_topic": sim.topics_of(cfg, ads),
            "click": imp["click"].to_numpy().astype(np.float64), "logit": _logit(imp["p_click"].to_numpy()),
            "propensity": sim.user_propensity(cfg, users),
            "interest": sim._GAMMA * sim.interest_affinity(cfg, date, users, ads),
            **dict(zip(("own_quality", "born"), sim.ad_own_quality(cfg, ads, date), strict=True)),
        })
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _topic_counts(cfg, surfaces, date: dt.date, users: np.ndarray, lookback: int = LOOKBACK) -> list[np.ndarray]:
    """[day before `date`, the day before it, ...] (`lookback` of them) of (len(users), topics): how many organic
    items of each topic each user touched that day, on every surface (ids churn: rows follow `users`); the first n
    summed are the counts of an n-day history."""
    uids = np.unique(users)
    by_day = []
    for back in range(1, lookback + 1):
        counts = np.zeros((len(uids), cfg.n_topics))
        for s in surfaces.names:
            _, org = sim.simulate_day_frames(cfg, surfaces, s, date - dt.timedelta(days=back))
            ids = org["user_id"].to_numpy()
            pos = np.minimum(np.searchsorted(uids, ids), len(uids) - 1)
            keep = uids[pos] == ids
            topic = sim.topics_of(cfg, org["item_id"].to_numpy()[keep])
            np.add.at(counts, (pos[keep], topic), 1.0)
        by_day.append(counts[np.searchsorted(uids, users)])
    return by_day


def _log_share(cfg, counts: np.ndarray, topic: np.ndarray) -> np.ndarray:
    return np.log((counts[np.arange(len(counts)), topic] + PRIOR) / (counts.sum(1) + PRIOR * cfg.n_topics))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lookbacks", type=int, nargs="*", default=[],
                   help="also the history-topics variants on these many days before the scored one (default 7 only)")
    a = p.parse_args(argv)
    cfg, surfaces = load_simulator(), load_surfaces()
    roles = load_calendar().roles()
    days = {"E-1": roles.validation, "E": roles.evaluation}
    data = {}
    for role, date in days.items():
        d = _day(cfg, surfaces, date)
        by_day = _topic_counts(cfg, surfaces, date, d["user"], max([LOOKBACK, *a.lookbacks]))  # each day simulated once
        d["history_topic"] = _log_share(cfg, sum(by_day[:LOOKBACK]), d["ad_topic"])
        for n in a.lookbacks:
            d[f"history_topic_{n}"] = _log_share(cfg, sum(by_day[:n]), d["ad_topic"])
        data[role] = d
    variants = {
        "oracle": None,
        "no propensity": lambda d: np.column_stack([d["logit"] - d["propensity"]]),
        "no interest": lambda d: np.column_stack([d["logit"] - d["interest"]]),
        "neither": lambda d: np.column_stack([d["logit"] - d["interest"] - d["propensity"]]),
        "no interest + history topics": lambda d: np.column_stack([d["logit"] - d["interest"], d["history_topic"]]),
        "neither + history topics": lambda d: np.column_stack([d["logit"] - d["interest"] - d["propensity"],
                                                               d["history_topic"]]),
        NEW_BLIND: lambda d: np.column_stack([d["logit"] - d["own_quality"] * d["born"], d["born"]]),
        **{f"no interest + history topics, {n} day(s)": (
            lambda d, n=n: np.column_stack([d["logit"] - d["interest"], d[f"history_topic_{n}"]])) for n in a.lookbacks},
    }
    print(f"simulator: {cfg.impressions_per_day} impressions/day, E-1 = {days['E-1']}, E = {days['E']}; "
          f"click NE on E per surface (each map fitted on E-1)\n")
    print("| variant | " + " | ".join(surfaces.names) + " |")
    print("|---|" + "---|" * len(surfaces.names))
    scored: dict[str, dict[str, np.ndarray]] = {}
    for name, feats in variants.items():
        cells = []
        for s in surfaces.names:
            tr, ev = ({k: v[d["surface"] == s] for k, v in d.items()} for d in (data["E-1"], data["E"]))
            p = 1 / (1 + np.exp(-ev["logit"])) if feats is None else _apply(fit_logistic(feats(tr), tr["click"]), feats(ev))
            scored.setdefault(name, {})[s] = p
            cells.append(f"{normalized_entropy(ev['click'], p):.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    new_ads_ceiling(data["E"], scored, surfaces.names)
    oracle_by_day(cfg, surfaces)


def new_ads_ceiling(ev: dict[str, np.ndarray], scored: dict[str, dict[str, np.ndarray]], names: list[str]) -> None:
    """Each variant's share of the oracle's gap (base rate to oracle, as day_report's `gap_closed`) on the rows
    of the ads launched on E, per surface and pooled, and on every row pooled: what each missing piece costs
    on the new ads, beside what it costs everywhere."""
    if not ev["born"].any():
        print("\nno ad was launched on E (a world without churn): no table of the new ads")
        return
    order = np.concatenate([np.flatnonzero(ev["surface"] == s) for s in names])
    y, born, surf = ev["click"][order], ev["born"][order], ev["surface"][order]
    oracle = np.concatenate([scored["oracle"][s] for s in names])
    groups = [(s, born & (surf == s)) for s in names] + [("all", born), ("every row, all", np.ones(len(y), bool))]
    print("\nthe share of the oracle's gap each variant closes on E's rows of the ads launched on E (clicks in "
          "brackets), and on every row\n")
    print("| variant | " + " | ".join(f"{g} ({int(y[m].sum()):,})" for g, m in groups) + " |")
    print("|---|" + "---|" * len(groups))
    for name, per_surface in scored.items():
        p = np.concatenate([per_surface[s] for s in names])
        cells = [(1 - normalized_entropy(y[m], p[m])) / (1 - normalized_entropy(y[m], oracle[m])) for _, m in groups]
        print(f"| {name} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")


def oracle_by_day(cfg, surfaces) -> None:
    """The oracle on every day of the calendar: click NE and calibration per surface."""
    print("\nthe oracle per day: click NE / calibration (sum of p_click / clicks), clicks\n")
    print("| day | " + " | ".join(surfaces.names) + " |")
    print("|---|" + "---|" * len(surfaces.names))
    by_day, clicks = [], []
    for date in load_calendar().dates():
        d = _day(cfg, surfaces, date)
        cells, day_cal = [], []
        for s in surfaces.names:
            m = d["surface"] == s
            y, p = d["click"][m], 1 / (1 + np.exp(-d["logit"][m]))
            day_cal.append(p.sum() / y.sum())
            clicks.append(y.sum())
            cells.append(f"{normalized_entropy(y, p):.4f} / {day_cal[-1]:.3f}, {int(y.sum())}")
        by_day.append(day_cal)
        print(f"| {date} | " + " | ".join(cells) + " |")
    cals = np.array(by_day)
    print(f"\nthe oracle's calibration is outside 0.95-1.05 on {np.mean(np.abs(cals - 1) > 0.05):.0%} of the "
          f"{cals.size} (day, surface) cells")
    calibration_power(cals, float(np.mean(clicks)), len(surfaces.names))


def calibration_power(by_day: np.ndarray, clicks: float, n_surfaces: int) -> None:
    """A perfect model behind the pipeline's calibrator: the map fitted on day d-1 scales it by
    that day's clicks / expected clicks, and E's clicks are counted again, so its calibration on d
    reads cal(d) / cal(d-1) (by_day: [days, surfaces] of the oracle's calibration). With n clicks a
    day, log cal has sd ~ 1/sqrt(n), the ratio sqrt(2/n)."""
    from statistics import NormalDist

    ratio = by_day[1:] / by_day[:-1]
    inside = np.abs(ratio - 1) <= 0.05
    print(f"\na perfect model with the map fitted on the day before: within 0.95-1.05 on {inside.mean():.0%} of "
          f"the {inside.size} (day, surface) cells, on all {n_surfaces} surfaces on {int(inside.all(1).sum())} of "
          f"{len(ratio)} days")
    z = NormalDist()

    def p_all(n: float) -> float:  # P(every surface within +-5%), normal approximation of log cal
        return (2 * z.cdf(np.log(1.05) / np.sqrt(2 / n)) - 1) ** n_surfaces

    need = next(n for n in range(100, 100_000, 50) if p_all(n) >= 0.8)
    print(f"at {clicks:.0f} clicks per (day, surface): P(all {n_surfaces} within) ~ {p_all(clicks):.0%} "
          f"(normal approximation); 80% needs ~{need:,} clicks per (day, surface), {need / clicks:.1f}x")


if __name__ == "__main__":
    main()
