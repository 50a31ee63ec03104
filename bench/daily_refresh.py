"""A daily refresh of a stale foundation against the serving-time fold-in: warm-start from a version and
train on the one day that entered the teacher window since (run_foundation(train_days=...)), then score
day E as teacher_predictions does, the stale and the refreshed version each without and with the fold-in
(bench/serving_fold_in.py's score_day). Prints click NE, the share of the oracle gap closed and the
calibration against the truth, every surface pooled.

    GEM_SIMULATOR=eval GEM_HOME=<a finished week> python bench/daily_refresh.py --day <E> --init <version dir> \\
        --out-root <a scratch home> [--epochs 1] [--warm-lr-frac 0.1]

The refreshed version goes under <out-root>/models/ (never the home's ACCEPTED). E's teacher window ends
at E-3 (assets/calendar.yaml's teacher_lag_days 1): the refresh trains on E-3 alone, selects on E-1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.config import load_calendar  # noqa: E402
from gem_model.eval.metrics import normalized_entropy  # noqa: E402
from gem_model.models.registry import load_model  # noqa: E402
from gem_model.train.foundation import run_foundation  # noqa: E402

_spec = importlib.util.spec_from_file_location("serving_fold_in_bench", Path(__file__).with_name("serving_fold_in.py"))
serving_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving_bench)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--day", required=True, help="E, the day scored")
    p.add_argument("--init", required=True, type=Path, help="the stale foundation version's dir")
    p.add_argument("--out-root", required=True, type=Path, help="where the refreshed version is written")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warm-lr-frac", type=float, default=0.1)
    p.add_argument("--serve-slices", type=int, default=4, help="train.item_svd.serve_slices of both versions")
    a = p.parse_args(argv)
    day = dt.date.fromisoformat(a.day)
    base = load_calendar()
    calendar = base.model_copy(update={"days": (day - base.start).days + 1})
    _, config = load_model(a.init / "model.pt")
    new_day = (calendar.roles().teacher[1]).isoformat()
    t0 = time.perf_counter()
    res = run_foundation(config["preset"], calendar=calendar, out_root=a.out_root, init_from=a.init, baselines=False,
                         train_days=(new_day, new_day), device="cpu",
                         overrides={"train": {"epochs": a.epochs, "warm_lr_frac": a.warm_lr_frac}})
    print(f"refreshed {a.init.name} on {new_day} -> {res['version']} (best step {res['best_step']}, "
          f"{time.perf_counter() - t0:.0f} s)")
    print("\n| version | fold-in | NE | gap closed | calibration |\n|---|---|---|---|---|")
    for name, vdir in (("stale", a.init), ("refreshed", Path(res["version_dir"]))):
        df, _ = serving_bench.score_day(day, vdir, a.serve_slices)
        y, o = df["click"].to_numpy(), df["oracle_p"].to_numpy()
        floor = normalized_entropy(y, o)
        for col, label in (("base", "none"), ("folded", "as served")):
            ne = normalized_entropy(y, df[col].to_numpy())
            print(f"| {name} | {label} | {ne:.4f} | {(1 - ne) / (1 - floor):.3f} | {df[col].mean() / o.mean():.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
