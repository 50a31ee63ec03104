"""What the students' resumable state costs: the distillation report's students (the demo's arms and paths, seed 0)
trained with and without checkpoints, side by side on one lake, in alternating order.

    GEM_DATA=douban GEM_HOME=.gem/douban python bench/student_checkpoints.py [--rounds 1] [--preset small]

GEM_HOME: a home after `make demo [DATA=...]` (its lake and ACCEPTED teachers). Prints the wall seconds of each
arm of the comparison, their ratio, and the checkpoints left (one per student, its last state) with their size.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# bench/kernels.py would shadow the `kernels` package when this file runs as a script
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if p not in ("", _HERE)] + [str(Path(_HERE).parent)]
os.environ.setdefault("WANDB_MODE", "disabled")  # the comparison, not its W&B runs

from gem_model.config import env  # noqa: E402
from gem_model.distill import run_distillation  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402
from gem_pipelines.assets.students import StudentsConfig, teacher_checkpoints  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--preset", default=str(env("GEM_MODEL_PRESET")))
    args = ap.parse_args()
    demo = StudentsConfig()
    teachers = teacher_checkpoints()
    files: list[int] = []
    times: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(args.rounds):
        for mode in (["without", "with"] if r % 2 == 0 else ["with", "without"]):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                run_distillation(demo.arms, demo.paths, [0], preset=args.preset, teachers=teachers,
                                 uri=table_uri("training_examples"), tp_uri=table_uri("teacher_predictions"),
                                 oracle_uri=table_uri("oracle"), checkpoint_dir=tmp if mode == "with" else None)
                times[mode].append(time.perf_counter() - t)
                if mode == "with":
                    files = [p.stat().st_size for p in Path(tmp).glob("*.pt")]
            print(f"round {r} {mode} checkpoints: {times[mode][-1]:.1f} s", flush=True)
    without, with_ = sum(times["without"]), sum(times["with"])
    print(f"\n| students trained | without checkpoints (s) | with (s) | with / without | students' checkpoints | "
          f"their size (MB) |\n|---|---|---|---|---|---|\n| preset {args.preset}, arms {', '.join(demo.arms)}, "
          f"{args.rounds} round(s) | {without:.1f} | {with_:.1f} | {with_ / without:.3f} | {len(files)} | "
          f"{sum(files) / 1e6:.0f} |")


if __name__ == "__main__":
    main()
