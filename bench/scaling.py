"""Every number docs/scaling.md cites, computed from the repo: presets, features, the lake schema,
the model itself and the measured CPU throughput in bench/RESULTS.md.

    python bench/scaling.py                 # under a minute on 2 CPU cores (most of it the large preset's FLOPs)
    python bench/scaling.py --gpu-samples-per-s 120000 --preset large   # GPUs from a throughput you measured

Sections: (1) parameters and embedding rows per preset (built on the meta device); (2) bytes per
sample of `training_examples` (Arrow in memory, Parquet in the Delta table), measured on synthetic
days with the lake schema; (3) tokens per sample and per day; (4) matmul FLOPs per sample (forward +
backward, torch.utils.flop_counter, full history); (5) training-state memory per GPU, replicated vs
sharded, for the presets and for a production-size vocabulary; (6) step time and a daily retrain at
the measured samples/s; (7) GPUs for a daily retrain: a lower bound from the GPU's spec-sheet peak,
and a count from a throughput you measured (--gpu-samples-per-s). Volumes beyond the demo's are
hypothetical orders of magnitude (flagged in the output), not anyone's production figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "model"))  # make_batch: random batches without a lake

from gem_model.config import load_calendar, load_features, load_simulator  # noqa: E402
from gem_model.models.config import GEMConfig  # noqa: E402
from gem_model.models.gem import build_model  # noqa: E402
from gem_model.train.config import load_preset  # noqa: E402

PRESETS = ("tiny", "small", "base", "large")
GB = 1e9
# Training state per parameter, fp32 master weights (dense gradients everywhere):
DENSE_BYTES = 4 + 4 + 8  # weight + grad + AdamW (m, v)
EMB_BYTES = 4 + 4  # weight + dense grad (per element); RowWiseAdagrad adds 4 bytes per row
ADAGRAD_ROW_BYTES = 4
# Hypothetical daily volumes (impressions/day) beside the demo's: orders of magnitude, not measured.
VOLUMES = {"1e8 (hypothetical)": 1e8, "1e10 (hypothetical)": 1e10}
# A production-size vocabulary (hypothetical): rows per table at the large preset's d_model.
PROD_ROWS = {"user": 1_000_000_000, "item": 100_000_000, "advertiser": 10_000_000}
H200_BF16_DENSE_PEAK = 989e12  # FLOP/s, NVIDIA's H100/H200 SXM spec sheet (dense bf16): a ceiling, not a measurement
GPU_GB = 80  # the GPU memory the memory plan asks about


def preset_configs() -> dict[str, GEMConfig]:
    return {p: GEMConfig.from_specs(load_preset(p)["model"]) for p in PRESETS}


def param_counts(cfg: GEMConfig) -> tuple[int, int]:
    """(embedding, dense) parameters of the model, built on the meta device (no memory)."""
    model = build_model(cfg, device="meta")
    emb = sum(p.numel() for p in model.embedding_parameters())
    return emb, sum(p.numel() for p in model.parameters()) - emb


def bytes_per_sample(max_len: int) -> dict[str, float]:
    """Arrow and Parquet bytes per row of `training_examples`, and per history element, from two
    synthetic days (histories U[0, 16] and U[0, max_len]) written as Delta tables."""
    from gem_model.data.synthetic import synthetic_day

    points = []
    for cap in (16, max_len):
        ex, _ = synthetic_day(dt.date(2026, 11, 2), 20_000, seed=1, max_hist=cap)
        with tempfile.TemporaryDirectory() as d:
            ex.write_delta(d, delta_write_options={"partition_by": ["date"]})
            parquet = sum(f.stat().st_size for f in Path(d).rglob("*.parquet"))
        mean_len = float(ex["hist_item_id"].list.len().mean())
        points.append((mean_len, ex.estimated_size() / ex.height, parquet / ex.height))
    (l0, a0, p0), (l1, a1, p1) = points
    arrow_per_el, parquet_per_el = (a1 - a0) / (l1 - l0), (p1 - p0) / (l1 - l0)
    return {"mean_len": l1, "arrow_row": a1, "parquet_row": p1, "arrow_fixed": a1 - arrow_per_el * l1,
            "parquet_fixed": p1 - parquet_per_el * l1, "arrow_per_el": arrow_per_el, "parquet_per_el": parquet_per_el}


def flops_per_sample(cfg: GEMConfig, hist_len: int, batch: int = 2) -> float:
    """Matmul FLOPs of forward + backward per sample with full histories (torch.utils.flop_counter)."""
    from helpers import make_batch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(make_batch(cfg, [hist_len] * batch))
        logits.float().sum().backward()
    del model
    return counter.get_total_flops() / batch


def state_bytes(dense: int, emb_elems: int, emb_rows: int) -> float:
    return dense * DENSE_BYTES + emb_elems * EMB_BYTES + emb_rows * ADAGRAD_ROW_BYTES


def measured(pattern: str, what: str) -> list[float]:
    """Numbers measured by bench/*.py, read from bench/RESULTS.md (so every figure traces to a run)."""
    m = re.search(pattern, (ROOT / "bench" / "RESULTS.md").read_text())
    if not m:
        raise SystemExit(f"bench/RESULTS.md has no {what} line: run the bench that measures it")
    return [float(g.replace(",", "")) for g in m.groups()]


def measured_cpu_samples_per_s() -> float:
    return measured(r"train\(\) samples/s \(small, end to end\)\s+([\d,]+)", "train() samples/s")[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retrain-hours", type=float, default=4.0, help="wall-clock budget of a daily retrain")
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64], help="GPU counts for the memory table")
    ap.add_argument("--gpu-samples-per-s", type=float, default=None,
                    help="training samples/s of ONE GPU you measured (bench/train.py on it) for --preset")
    ap.add_argument("--preset", default="large", choices=PRESETS, help="preset of --gpu-samples-per-s")
    ap.add_argument("--skip-flops", action="store_true", help="skip the FLOP counts (the slow part)")
    a = ap.parse_args(argv)

    feats, cal, sim = load_features(), load_calendar(), load_simulator()
    cfgs = preset_configs()
    max_len = feats.history.max_len
    n_sparse = len(feats.sparse)
    rows = sum(feats.tables.values())

    print("## 1. Parameters and embedding rows per preset (assets/models/*.yaml + assets/features.yaml)\n")
    print(f"tables (rows): {dict(feats.tables)} = {rows:,} rows\n")
    print("| preset | d_model | embedding params | dense params | total | embedding share |")
    print("|---|---|---|---|---|---|")
    counts = {}
    for p, cfg in cfgs.items():
        emb, dense = param_counts(cfg)
        counts[p] = (emb, dense)
        print(f"| {p} | {cfg.d_model} | {emb:,} | {dense:,} | {emb + dense:,} | {emb / (emb + dense):.1%} |")

    print("\n## 2. Bytes per sample of training_examples (synthetic days, the lake schema)\n")
    b = bytes_per_sample(max_len)
    print(f"| | per row at mean history {b['mean_len']:.1f} | fixed per row | per history element | per row at L={max_len} |")
    print("|---|---|---|---|---|")
    for kind in ("arrow", "parquet"):
        full = b[f"{kind}_fixed"] + b[f"{kind}_per_el"] * max_len
        print(f"| {kind} | {b[f'{kind}_row']:.0f} B | {b[f'{kind}_fixed']:.0f} B | {b[f'{kind}_per_el']:.1f} B | {full:.0f} B |")
    parquet_full = b["parquet_fixed"] + b["parquet_per_el"] * max_len

    print("\n## 3. Tokens per sample and per day\n")
    tokens = 1 + n_sparse + max_len
    print(f"tokens per sample = 1 dense + {n_sparse} sparse + up to {max_len} history = {tokens}")
    volumes = {f"demo ({sim.impressions_per_day:,}, assets/simulator.yaml)": float(sim.impressions_per_day), **VOLUMES}
    print(f"\n| impressions/day | tokens/day | training_examples/day (Parquet, L={max_len}) |")
    print("|---|---|---|")
    for name, n in volumes.items():
        print(f"| {name} | {n * tokens:.3g} | {n * parquet_full / GB:,.3g} GB |")

    flops = {}
    if not a.skip_flops:
        print(f"\n## 4. Matmul FLOPs per sample, forward + backward, history length {max_len}\n")
        print("| preset | GFLOP/sample |")
        print("|---|---|")
        for p, cfg in cfgs.items():
            flops[p] = flops_per_sample(cfg, max_len)
            print(f"| {p} | {flops[p] / 1e9:.4g} |")

    print("\n## 5. Training state per GPU (fp32 weights; dense: AdamW 16 B/param; embeddings: weight + dense grad "
          "8 B/element + row-wise Adagrad 4 B/row; activations excluded)\n")
    header = " | ".join(f"sharded over {n}" for n in a.gpus)
    print(f"| preset | replicated (DDP), per GPU | {header} |")
    print("|---|---|" + "---|" * len(a.gpus))
    for p, (emb, dense) in counts.items():
        total = state_bytes(dense, emb, rows)
        print(f"| {p} | {total / GB:.3g} GB | " + " | ".join(f"{total / n / GB:.3g} GB" for n in a.gpus) + " |")
    d = cfgs["large"].d_model
    prod_rows = {**dict(feats.tables), **PROD_ROWS}
    prod_elems = sum(prod_rows.values()) * d
    prod_emb = prod_elems * EMB_BYTES + sum(prod_rows.values()) * ADAGRAD_ROW_BYTES
    dense_large = counts["large"][1] * DENSE_BYTES
    print(f"\nproduction-size vocabulary (hypothetical) {PROD_ROWS} at d_model {d}: "
          f"{sum(prod_rows.values()):,} rows, {prod_elems:,} embedding params")
    print(f"| large, production vocabulary | embeddings {prod_emb / GB:,.0f} GB + dense {dense_large / GB:.3g} GB | "
          + " | ".join(f"{(prod_emb + dense_large) / n / GB:,.1f} GB" for n in a.gpus) + " |")
    print(f"GPUs of {GPU_GB} GB needed for the embedding state alone: {math.ceil(prod_emb / (GPU_GB * GB))}")
    print(f"the same with embedding grads not materialised (fused row-wise update): "
          f"{math.ceil((prod_elems * 4 + sum(prod_rows.values()) * 4) / (GPU_GB * GB))}")

    print("\n## 6. Step time and retrain time at the measured CPU throughput (bench/RESULTS.md)\n")
    cpu = measured_cpu_samples_per_s()
    small_batch = load_preset("small")["train"]["batch_size"]
    epochs = load_preset("small")["train"]["epochs"]
    roles = cal.roles()
    teacher_days = (roles.teacher[1] - roles.teacher[0]).days + 1
    demo_samples = teacher_days * sim.impressions_per_day * epochs
    print(f"measured: {cpu:,.0f} samples/s (small preset, 2 CPU threads, bench/train.py)")
    print(f"small step (batch {small_batch}): {small_batch / cpu * 1e3:.0f} ms")
    print(f"demo teacher window: {teacher_days} days x {sim.impressions_per_day:,} x {epochs} epoch(s) = "
          f"{demo_samples:,} samples -> {demo_samples / cpu:.0f} s of training at that rate")
    for name, n in VOLUMES.items():
        print(f"one day of {name} on that CPU: {n / cpu / 3600:,.0f} hours")

    print(f"\n## 7. GPUs for a daily retrain (one pass over one day, warm start, within {a.retrain_hours:g} h)\n")
    budget_s = a.retrain_hours * 3600
    for p in ("base", "large"):
        if p not in flops:
            continue
        print(f"{p}: {flops[p] / 1e9:.3g} GFLOP/sample")
        for name, n in volumes.items():
            need = n * flops[p] / budget_s
            print(f"  {name}: {need / 1e12:,.3g} TFLOP/s sustained -> at least "
                  f"{max(1, math.ceil(need / H200_BF16_DENSE_PEAK))} GPU(s) even at 100% of a 989 TFLOP/s peak")
    print("\n## 8. Ingest and the training stream at the measured CPU rates (bench/RESULTS.md)\n")
    records, ours, ours_gx = measured(r"whole day\s+all\s+(\d+)\s+[\d,]+\s+([\d,]+)\s+([\d,]+)", "ingest whole day")
    loader = measured(r"loader samples/s \(small, max_len 32\)\s+([\d,]+)", "loader samples/s")[0]
    per_impression = records / sim.impressions_per_day
    print(f"raw records per impression (demo day): {records:,.0f} / {sim.impressions_per_day:,} = {per_impression:.2f}")
    print(f"ingest (one process): {ours:,.0f} records/s, {ours_gx:,.0f} with the GX suites; "
          f"loader (one rank): {loader:,.0f} samples/s")
    print("\n| impressions/day | ingest, one process | ingest + GX, one process | processes for ingest + GX "
          f"in {a.retrain_hours:g} h | one rank reading the whole day |")
    print("|---|---|---|---|---|")
    for name, n in volumes.items():
        rec = n * per_impression
        print(f"| {name} | {rec / ours / 3600:,.3g} h | {rec / ours_gx / 3600:,.3g} h | "
              f"{math.ceil(rec / ours_gx / budget_s)} | {n / loader / 3600:,.3g} h |")

    if a.gpu_samples_per_s:
        print(f"\nfrom your measurement ({a.preset}: {a.gpu_samples_per_s:,.0f} samples/s on one GPU):")
        for name, n in volumes.items():
            print(f"  {name}: {math.ceil(n / (a.gpu_samples_per_s * budget_s))} GPU(s) (linear scaling assumed)")


if __name__ == "__main__":
    main()
