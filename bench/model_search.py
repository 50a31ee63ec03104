"""The foundation model's schedule / regularisation search, on the validation day E-1 only.

    PYTHONPATH=. GEM_HOME=<a home with the demo lake> python bench/model_search.py [--variants a b ...]

Trains the foundation model (every surface, the calendar's teacher window, seed 0) once per variant
of the preset's `train`/`model` settings, with validation on E-1 every `eval_every` steps and
early stopping, and reports the best E-1 click NE per surface and its step. The evaluation day E is
never read here (data.eval is unset). Appends the table to bench/MODEL_SEARCH.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sys
import tempfile
import time
from pathlib import Path

# `python bench/model_search.py` puts bench/ first on sys.path, where bench/kernels.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gem_model.config import load_calendar  # noqa: E402
from gem_model.train import train  # noqa: E402

# name -> overrides of assets/models/<preset>.yaml
VARIANTS: dict[str, dict] = {
    "preset": {},
    "emb_lr_0.05": {"train": {"emb_lr": 0.05}},
    "emb_lr_0.005": {"train": {"emb_lr": 0.005}},
    "lr_0.003": {"train": {"lr": 0.003}},
    "wide_wd_0": {"train": {"wide_weight_decay": 0.0}},
    "emb_dropout_0.1": {"model": {"emb_dropout": 0.1}},
    "no_target_attention": {"model": {"target_attention": False}},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="small")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--out", default=str(Path(__file__).with_name("MODEL_SEARCH.md")))
    a = p.parse_args()
    roles = load_calendar().roles()
    lines = [f"\n## {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, preset `{a.preset}`, teacher window "
             f"{roles.teacher[0]}..{roles.teacher[1]}, selection on E-1 = {roles.validation}\n",
             "| variant | overrides | best E-1 score | best step / steps | E-1 click NE per surface | train s |",
             "|---|---|---|---|---|---|"]
    for name in a.variants:
        over = VARIANTS[name]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.time()
            s = train({"preset": a.preset, "model": over.get("model", {}), "train": {"log_every": 10**6, **over.get("train", {})},
                       "data": {"train": [str(roles.teacher[0]), str(roles.teacher[1])], "valid": str(roles.validation)},
                       "seed": 0, "device": os.environ.get("GEM_DEVICE", "cpu"),
                       "tracking": {"name": f"search-{name}"}}, out_dir=tmp)
        per = ", ".join(f"{r['surface']} {r['ne']:.4f}" for r in s["valid_rows"]
                        if r["task"] == "click" and math.isfinite(r["ne"]))
        row = (f"| {name} | `{over}` | {s['best_valid_score']:.4f} | {s['best_step']} / {s['step']} | {per} | "
               f"{time.time() - t:.0f} |")
        print(row, flush=True)
        lines.append(row)
    with open(a.out, "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
