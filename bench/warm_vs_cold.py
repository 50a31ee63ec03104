"""A warm-started retrain of the foundation against a cold one on the same window, 3 seeds, paired
intervals on E per surface (issue 24; gem_model.train.warm_vs_cold). Prints a table, never pass/fail.

    PYTHONPATH=. GEM_HOME=/tmp/gem_wvc python bench/warm_vs_cold.py [--preset small] [--seeds 0 1 2] [--shift 1] [--lr]

Needs a lake with the calendar's window (e.g. after `make demo`, or GEM_SIMULATOR=eval for the
evaluation world). The new window is the calendar's teacher window (validation E-1, evaluation E);
the old model is trained on that window moved back by --shift days (what the ACCEPTED version was
`shift` days ago). Cost: 3 trainings per seed (old, warm, cold) of the preset on its window; --lr adds
the logistic regression per seed and compares it with the warm retrain on E's ads first seen on E.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]  # bench/kernels.py would shadow the package
sys.path.insert(0, str(_HERE.parent))

from gem_model.config import load_calendar  # noqa: E402
from gem_model.models.registry import read_accepted  # noqa: E402
from gem_model.store.paths import gem_home  # noqa: E402
from gem_model.train.warm_vs_cold import markdown, warm_vs_cold  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--shift", type=int, default=1, help="days between the old window and the new one")
    p.add_argument("--device", default="auto")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--lr", action="store_true", help="also the logistic regression, on ads first seen on E")
    p.add_argument("--from-accepted", action="store_true",
                   help="warm-start every seed from the ACCEPTED foundation (as the weekly retrain does) instead of "
                        "training an old model per seed on the window moved back by --shift")
    p.add_argument("--warm-set", default=None, type=json.loads,
                   help='train settings of the warm run alone, JSON (e.g. \'{"warm_lr_frac": 0.1}\')')
    p.add_argument("--reuse", default=None, help="a previous run's --out: its old and cold models, not trained again")
    p.add_argument("--compare-only", action="store_true",
                   help="train nothing: compare the seeds' models already under --out (e.g. links to runs made apart)")
    p.add_argument("--out", default=None, help="run folder (default: $GEM_HOME/bench/warm_vs_cold)")
    a = p.parse_args(argv)
    if a.shift < 1:
        p.error("--shift must be >= 1")
    roles = load_calendar().roles()
    back = dt.timedelta(days=a.shift)
    first = max(roles.teacher[0] - back, roles.warmup + dt.timedelta(days=1))
    old_train = (first.isoformat(), (roles.teacher[1] - back).isoformat())
    if old_train[1] < old_train[0]:
        p.error(f"--shift {a.shift} leaves the old window empty")
    out = Path(a.out) if a.out else gem_home() / "bench" / "warm_vs_cold"
    accepted = read_accepted("foundation_model") if a.from_accepted else None
    if a.from_accepted and accepted is None:
        p.error("--from-accepted: no ACCEPTED foundation_model in this GEM_HOME (run `make demo` first)")
    result = warm_vs_cold({"preset": a.preset, "device": a.device}, old_train=old_train,
                          old_valid=(roles.validation - back).isoformat(),
                          new_train=(roles.teacher[0].isoformat(), roles.teacher[1].isoformat()),
                          new_valid=roles.validation.isoformat(), evaluation=roles.evaluation.isoformat(),
                          seeds=a.seeds, out_root=out, n_boot=a.n_boot, lr=a.lr, init_from=accepted,
                          warm_train=a.warm_set, reuse=a.reuse, compare_only=a.compare_only)
    (out / "warm_vs_cold.json").write_text(json.dumps(result, indent=1, default=str))
    table = markdown(result)
    (out / "warm_vs_cold.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
