"""`make eval`: the published protocol. 3 seeds of the foundation model, its single-surface
baselines, the base rate and a logistic regression on hand-built features (gem_model.baselines),
all on the same rows of E, and every distillation arm x path with 3 seeds, on the lake `make demo`
built.

Writes reports/foundation_eval_3seeds.json, reports/model_quality.md (the README's table: click NE
per surface, seed mean +- sd, 95% bootstrap interval of the seed mean, calibration, share of the
base-rate-to-oracle gap closed, paired differences foundation - other model with their intervals)
and reports/distillation_report_3seeds.json, and prints its runtime. Selection and early stopping
use the validation day E-1 only; E is reported, never tuned on.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict
from typing import Any

from gem_model.model_quality import model_quality, quality_markdown, run_lr_baselines
from gem_model.paths import reports_dir


def mean_spread(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[tuple, float, float, int]]:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("ne") is not None and math.isfinite(r["ne"]):
            groups[tuple(r[k] for k in keys)].append(r["ne"])
    out = []
    for k, v in sorted(groups.items()):
        m = sum(v) / len(v)
        sd = (sum((x - m) ** 2 for x in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0.0
        out.append((k, m, sd, len(v)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--preset", default=os.environ.get("GEM_MODEL_PRESET", "small"))
    parser.add_argument("--skip-distillation", action="store_true")
    args = parser.parse_args(argv)
    from gem_model.distill import ARMS, DEFAULT_PATHS, run_distillation, write_report
    from gem_model.foundation import run_foundation, write_eval_report
    from gem_model.registry import read_accepted, resolve_checkpoint

    t0 = time.time()
    # one seed at a time, each a complete comparison (foundation, single-surface, LR, base rate):
    # the report is rewritten after every seed, so a cut-short run still reports the seeds it did
    results: list[dict] = []
    rows: list[dict] = []
    for seed in args.seeds:
        result = run_foundation(args.preset, seeds=(seed,), baselines=True)
        results.append(result)
        rows += result["rows"] + run_lr_baselines(result, [seed])
        quality = model_quality(results, [r["seeds"][0] for r in results])
        path = write_eval_report(rows, reports_dir() / "foundation_eval_3seeds.json", extra={"quality": quality})
        md = reports_dir() / "model_quality.md"
        md.write_text(quality_markdown(quality, len(results), time.time() - t0))
        print(f"\nafter seed {seed}:\n" + md.read_text(), flush=True)
    result = results[0]
    print(f"\nfoundation ({len(args.seeds)} seeds, click NE on E, mean +- sd)  -> {path}")
    for (model, surface, task), m, sd, n in mean_spread(rows, ("model", "surface", "task")):
        if task == "click":
            print(f"  {model:<15} {surface:<12} {m:.4f} +- {sd:.4f}  (n={n})")
    oracle = {r["surface"]: r["oracle_ne"] for r in result["rows"] if r["task"] == "click"}
    if any(v is None for v in oracle.values()):  # real logs (GEM_DATA): no true probabilities
        print("  oracle floor    none (real data): see reports/real_data_report.md for bootstrap intervals")
    else:
        print("  oracle floor    " + "  ".join(f"{s}={v:.4f}" for s, v in sorted(oracle.items())))
    if not args.skip_distillation:
        teachers = {"foundation": str(resolve_checkpoint(result["version_dir"]))}
        from gem_pipelines.partitions import SURFACES

        for domain in [d for d in SURFACES.domains if len(SURFACES.in_domain(d)) >= 2]:  # hierarchical path
            accepted = read_accepted("domain_models", domain)
            if accepted is None:
                raise SystemExit(f"no ACCEPTED domain model for {domain}: run `make demo` first")
            teachers[f"domain:{domain}"] = str(resolve_checkpoint(accepted))
        rows = run_distillation(list(ARMS), list(DEFAULT_PATHS), args.seeds, preset=args.preset, teachers=teachers)
        path = write_report(rows, reports_dir() / "distillation_report_3seeds.json")
        print(f"\ndistillation (click NE on E, mean +- sd over seeds)  -> {path}")
        for (arm, p, surface, split, task), m, sd, _n in mean_spread(rows, ("arm", "path", "surface", "split", "task")):
            if task == "click" and split == "evaluation":
                print(f"  {arm:<18} {p:<13} {surface:<12} {m:.4f} +- {sd:.4f}")
    print(f"\nmake eval took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
