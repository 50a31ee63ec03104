"""Training benchmarks on CPU (or GPU with --device cuda); prints ratios side by side, never pass/fail.

    python bench/train.py [--rows 20000] [--steps 30] [--device cpu] [--skip-compile]
    python bench/train.py --device cuda            # the synthetic step bench only when polars is missing
    python bench/train.py --synthetic [--preset base] [--precision bf16] [--batch-size 4096] [--smoke-steps 100]

Lake benches (need polars/deltalake; skipped with --synthetic):
1. samples/s of the `small` preset: the loader alone, and train() end to end;
2. the jagged model vs its padded-sequence variant (same weights, same batches): step time ratio;
3. torch.compile (GEM.compile_dense, as train() does): cold start (empty inductor cache) vs warm
   start (the same cache), each in a fresh process, time to the first compiled training step.

Synthetic step bench (gem_model.models.synthetic_batches: in memory, torch + PyYAML only; `base` preset and
bf16 on CUDA by default): samples/s, step time, operators per step (torch profiler, CPU-side aten
ops) and CUDA kernel launches per step, peak memory, MFU (model FLOPs from torch's FlopCounterMode
plus the jagged attention's real-token FLOPs, over --peak-tflops); optionally a bf16-vs-fp32
smoke run (same seed, same batches) comparing the mean loss of the last 10 of --smoke-steps steps.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
# `python bench/train.py` puts bench/ first on sys.path, where bench/kernels.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

START = dt.date(2026, 11, 1)


def make_lake(home: Path, rows: int) -> None:
    from gem_model.data.synthetic import write_synthetic_lake

    if not (home / "lake" / "training_examples").exists():
        write_synthetic_lake(str(home / "lake"), [START + dt.timedelta(days=i) for i in range(4)], rows, max_hist=96)


def bench_loader(rows_days: tuple[str, str], batch_size: int) -> float:
    from gem_model.data.loader import ExampleStream

    s = ExampleStream(*rows_days, batch_size=batch_size, max_len=32)
    t, n = time.perf_counter(), 0
    for b in s:
        n += len(b)
    return n / (time.perf_counter() - t)


def bench_train(home: Path, steps: int, device: str) -> dict:
    from gem_model.train.loop import train

    out = home / "bench_small"
    s = train({"preset": "small", "device": device, "out_dir": str(out),
               "data": {"train": ["2026-11-02", "2026-11-03"], "valid": None, "eval": None},
               "train": {"max_steps": steps, "log_every": max(1, steps // 3)}})
    return {"samples_per_s": s["samples_per_s"], "steps": s["step"]}


def bench_jagged_vs_padded(steps: int, device: str) -> dict:
    import torch

    from gem_model.data.loader import ExampleStream
    from gem_model.models import GEM, GEMConfig
    from gem_model.train.config import load_preset

    dims = load_preset("small")["model"]
    cfg = GEMConfig.from_specs(dims)
    stream = ExampleStream("2026-11-02", "2026-11-02", batch_size=load_preset("small")["train"]["batch_size"],
                           max_len=cfg.seq_len)
    batches = []
    for b in stream:
        batches.append(b.to(device))
        if len(batches) >= steps:
            break
    out = {}
    ref = None
    for attention in ("jagged", "padded"):
        torch.manual_seed(0)
        model = GEM(GEMConfig.from_dict({**cfg.to_dict(), "attention": attention})).to(device)
        if ref is None:
            ref = model.state_dict()
        else:
            model.load_state_dict(ref)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(b, model=model, opt=opt):
            loss, _ = model.loss(model(b), b)
            opt.zero_grad()
            loss.backward()
            opt.step()

        step(batches[0])  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for b in batches:
            step(b)
        if device == "cuda":
            torch.cuda.synchronize()
        dt_ = time.perf_counter() - t
        out[attention] = sum(len(b) for b in batches) / dt_
    tokens = sum(int(b.offsets[-1]) for b in batches) / sum(len(b) for b in batches)
    return {"jagged_samples_per_s": out["jagged"], "padded_samples_per_s": out["padded"],
            "speedup": out["jagged"] / out["padded"], "mean_history_len": tokens}


_COMPILE_CHILD = r"""
import time, json, sys, torch
t0 = time.perf_counter()
from gem_model.data.loader import ExampleStream
from gem_model.models import GEM, GEMConfig
from gem_model.train.config import load_preset
cfg = GEMConfig.from_specs(load_preset("small")["model"])
model = GEM(cfg).to(sys.argv[1]).compile_dense()  # what train() does with train.compile: true
it = iter(ExampleStream("2026-11-02", "2026-11-02", batch_size=1024, max_len=cfg.seq_len))
times = []
for _ in range(3):
    b = next(it).to(sys.argv[1])
    t1 = time.perf_counter()
    loss, _ = model.loss(model(b), b)
    loss.backward()
    times.append(time.perf_counter() - t1)
print(json.dumps({"first_step_s": times[0], "later_step_s": times[-1], "total_s": time.perf_counter() - t0}))
"""


def bench_compile(home: Path, device: str) -> dict:
    cache = home / "torch_compile_cache_bench"
    if cache.exists():
        import shutil

        shutil.rmtree(cache)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "GEM_HOME": str(home)}
    res = {}
    for label in ("cold", "warm"):
        p = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, device], env=env, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            return {"error": p.stderr[-2000:]}
        out = json.loads(p.stdout.strip().splitlines()[-1])
        res[label] = out["first_step_s"]
        res[f"{label}_later"] = out["later_step_s"]
    res["ratio"] = res["cold"] / max(res["warm"], 1e-9)
    return res


# ------------------------------------------------------------------------------------------------
# Synthetic step bench (no lake: torch + PyYAML only, so it runs on the GPU machine)


def make_step(model, device, precision: str, grad_clip: float = 1.0):
    """One training step as train() runs it (autocast, fp32 loss, clip, AdamW + row-wise Adagrad);
    returns the loss as a device tensor (no read-back)."""
    import torch

    from gem_model.train.optim import RowWiseAdagrad

    if precision == "fp32":  # (no gem_model.train.precision import: --ops-only also runs on older trees)
        amp_dtype = None
    else:
        from gem_model.train.precision import autocast_dtype

        amp_dtype = autocast_dtype(precision, device)
    dense = torch.optim.AdamW(model.dense_parameters(), lr=1e-3, betas=(0.9, 0.98), fused=True)  # as train() on CUDA
    emb = RowWiseAdagrad(model.embedding_parameters(), lr=0.05)
    dev_type = torch.device(device).type

    def step(batch):
        with torch.autocast(dev_type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            logits = model(batch)
        loss, _ = model.loss(logits, batch)
        dense.zero_grad(set_to_none=True)
        emb.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.dense_parameters(), grad_clip)
        dense.step()
        emb.step()
        return loss.detach()

    return step


def count_ops_per_step(step, batch, device) -> dict:
    """torch.profiler over one step (after warm-up): aten operators called (every level, CPU side),
    the compute ones among them, the top-level compute ones (called from Python, not from inside
    another aten op: a multi-tensor `_foreach_*` op counts once, as it launches once on CUDA while
    the CPU runs it tensor by tensor; the CPU proxy for launches) and CUDA kernels launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step(batch)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    with profile(activities=acts) as prof:
        step(batch)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CPU" and e.name.startswith("aten::")]
    compute = [e for e in events if e.name[len("aten::"):] not in _NOT_COMPUTE]
    top = [e for e in compute if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    return {"aten_ops": len(events), "compute_ops": len(compute), "top_level_compute_ops": len(top),
            "cuda_kernels": kernels}


# aten ops that launch no kernel (views, metadata, allocations, dispatch wrappers around a copy)
_NOT_COMPUTE = frozenset(
    "as_strided view reshape _reshape_alias transpose t unsqueeze squeeze select slice expand detach alias "
    "permute unbind split chunk narrow resolve_conj resolve_neg empty empty_strided empty_like to _to_copy "
    "contiguous lift_fresh _unsafe_view item _local_scalar_dense result_type".split()
)


def ops_only(preset: str = "tiny", batch_size: int = 256, compile_model: bool = False) -> dict:
    """Operators per fp32 CPU training step of `preset` on a fixed batch (tests.model.helpers'
    make_batch, which older trees have too, so the count can be compared across commits).
    compile_model: torch.compile the whole model (forward, and backward through AOT autograd)."""
    import torch

    from gem_model.models import GEM, GEMConfig
    from gem_model.train.config import load_preset
    from tests.model.helpers import make_batch

    cfg = GEMConfig.from_specs(load_preset(preset)["model"])
    g = torch.Generator().manual_seed(0)
    batch = make_batch(cfg, torch.randint(0, cfg.seq_len + 1, (batch_size,), generator=g).tolist())
    torch.manual_seed(0)
    model = GEM(cfg)
    if compile_model:
        model = torch.compile(model, dynamic=True)  # attribute access falls through to the GEM
    return count_ops_per_step(make_step(model, torch.device("cpu"), "fp32"), batch, "cpu")


def graph_breaks(preset: str = "tiny", batch_size: int = 64) -> dict:
    """torch._dynamo.explain of the model's forward + loss (same batch helper as ops_only)."""
    import torch

    from gem_model.models import GEM, GEMConfig
    from gem_model.train.config import load_preset
    from tests.model.helpers import make_batch

    cfg = GEMConfig.from_specs(load_preset(preset)["model"])
    g = torch.Generator().manual_seed(0)
    batch = make_batch(cfg, torch.randint(0, cfg.seq_len + 1, (batch_size,), generator=g).tolist())
    model = GEM(cfg)

    def fwd_loss(m, b):
        return m.loss(m(b), b)[0]

    ex = torch._dynamo.explain(fwd_loss)(model, batch)
    return {"graph_breaks": ex.graph_break_count, "graphs": ex.graph_count}


def attention_flops(cfg, batch) -> float:
    """Real-token FLOPs of the jagged attention of one fwd+bwd step (QK^T and PV, 2 FLOPs per MAC;
    backward 2x forward), summed over blocks: FlopCounterMode does not see the custom op."""
    lengths = (batch.offsets[1:] - batch.offsets[:-1]).double().cpu() + cfg.n_cls
    fwd = 4.0 * float((lengths**2).sum()) * cfg.d_model
    return 3.0 * fwd * cfg.n_blocks


def model_flops(model, step_fwd_bwd, batch) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        step_fwd_bwd(batch)
    return float(fc.get_total_flops()) + attention_flops(model.cfg, batch)


def bench_synthetic(preset: str, device: str, precision: str, batch_size: int, steps: int,
                    peak_tflops: float, compile_model: bool = False) -> dict:
    import torch

    from gem_model.models import GEM
    from gem_model.models.synthetic_batches import SyntheticBatches, config_from_assets
    from gem_model.train.precision import autocast_dtype

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as train() does
    cfg = config_from_assets(preset)
    torch.manual_seed(0)
    model = GEM(cfg).to(dev)
    stream = SyntheticBatches(cfg, batch_size, device=dev, pool=4, seed=0)
    it = iter(stream)
    step = make_step(torch.compile(model, dynamic=True) if compile_model else model, dev, precision)
    run = step
    amp_dtype = autocast_dtype(precision, dev)

    def fwd_bwd(b):
        with torch.autocast(dev.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            logits = model(b)
        model.loss(logits, b)[0].backward()

    flops = model_flops(model, fwd_bwd, stream.batches[0])
    t_first = time.perf_counter()
    for _ in range(3):  # warm-up (kernel compilation / autotuning, allocator)
        run(next(it))
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm_s = time.perf_counter() - t_first
    t0 = time.perf_counter()
    losses = [run(next(it)) for _ in range(steps)]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt_ = (time.perf_counter() - t0) / steps
    final = float(torch.stack(losses).mean())  # one read-back, after timing
    counts = count_ops_per_step(step, stream.batches[0], dev)
    out = {
        "preset": preset, "precision": precision, "batch_size": batch_size, "steps": steps,
        "mean_history": stream.mean_history(), "samples_per_s": batch_size / dt_, "step_ms": dt_ * 1e3,
        "warmup_s": warm_s, "loss": final, **counts, "gflop_per_step": flops / 1e9,
        "achieved_tflops": flops / dt_ / 1e12,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan"),
    }
    out["mfu"] = out["achieved_tflops"] / peak_tflops if dev.type == "cuda" else float("nan")
    return out


def bf16_smoke(preset: str, device: str, batch_size: int, steps: int) -> dict:
    """bf16 vs fp32 training from the same weights on the same synthetic batches: mean loss of the
    last 10 steps of each, and their relative difference."""
    import torch

    from gem_model.models import GEM
    from gem_model.models.synthetic_batches import SyntheticBatches, config_from_assets

    dev = torch.device(device)
    cfg = config_from_assets(preset)
    stream = SyntheticBatches(cfg, batch_size, device=dev, pool=8, seed=1)
    res = {}
    for precision in ("bf16", "fp32"):
        torch.manual_seed(0)
        model = GEM(cfg).to(dev)
        step = make_step(model, dev, precision)
        it = iter(stream)
        losses = torch.stack([step(next(it)) for _ in range(steps)])
        res[precision] = float(losses[-10:].mean())
        res[f"{precision}_first"] = float(losses[0])
    res["rel_diff"] = abs(res["bf16"] - res["fp32"]) / res["fp32"]
    return res


def synthetic_rows(a) -> list[tuple[str, str]]:
    import torch

    preset = a.preset or ("base" if a.device == "cuda" else "tiny")
    precision = a.precision or ("bf16" if a.device == "cuda" else "fp32")
    bs = a.batch_size or (4096 if a.device == "cuda" else 256)
    r = bench_synthetic(preset, a.device, precision, bs, a.steps, a.peak_tflops, a.compile_model)
    rows = [
        ("synthetic step: preset / precision / batch", f"{preset} / {precision} / {bs} (mean history "
         f"{r['mean_history']:.1f}){' / torch.compile(model)' if a.compile_model else ''}"),
        ("samples/s", f"{r['samples_per_s']:,.0f}"),
        ("step time (ms)", f"{r['step_ms']:.2f}"),
        ("aten operators per step, all / compute / top-level compute (profiler)",
         f"{r['aten_ops']} / {r['compute_ops']} / {r['top_level_compute_ops']}"),
        ("CUDA kernel launches per step (profiler)", str(r["cuda_kernels"]) if a.device == "cuda" else "n/a (cpu)"),
        ("peak memory (GiB)", f"{r['peak_mem_gib']:.2f}" if a.device == "cuda" else "n/a (cpu)"),
        ("model GFLOP per step", f"{r['gflop_per_step']:.1f}"),
        (f"MFU (vs {a.peak_tflops:g} TFLOP/s)", f"{r['mfu']:.3%}" if a.device == "cuda" else "n/a (cpu)"),
        ("warm-up, 3 steps (s)", f"{r['warmup_s']:.1f}"),
    ]
    if a.smoke_steps:
        sm = bf16_smoke(preset, a.device, bs, a.smoke_steps)
        rows.append((f"bf16 vs fp32 loss after {a.smoke_steps} steps (last-10 mean)",
                     f"{sm['bf16']:.4f} vs {sm['fp32']:.4f}: {sm['rel_diff']:.2%} apart "
                     f"({'within' if sm['rel_diff'] <= 0.02 else 'OUTSIDE'} 2%); first step {sm['fp32_first']:.4f}"))
    rows.append(("torch", f"{torch.__version__}; threads {torch.get_num_threads()}"))
    return rows


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000, help="synthetic rows per day")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--home", default=None, help="GEM_HOME for the bench (default: a temp dir)")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--synthetic", action="store_true", help="only the synthetic step bench (no lake, no polars)")
    ap.add_argument("--preset", default=None, help="synthetic bench preset (default: base on cuda, tiny on cpu)")
    ap.add_argument("--precision", default=None, help="bf16 | fp32 (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 4096 on cuda, 256 on cpu")
    ap.add_argument("--smoke-steps", type=int, default=0, help="also run bf16 vs fp32 for this many steps")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200: 989)")
    ap.add_argument("--compile-model", action="store_true", help="torch.compile the whole model (no graph break)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--ops-only", action="store_true", help="print aten operators per CPU step of `tiny` and exit")
    ap.add_argument("--graph-breaks", action="store_true", help="print dynamo graph breaks of `tiny` fwd+loss and exit")
    a = ap.parse_args()
    if a.graph_breaks:
        print(json.dumps(graph_breaks(a.preset or "tiny")))
        return
    if a.ops_only:
        print(json.dumps(ops_only(a.preset or "tiny", compile_model=a.compile_model)))
        return
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    lake_ok = all(_importable(m) for m in ("polars", "deltalake"))
    t = time.perf_counter()
    rows: list[tuple[str, str]] = [("device", a.device), ("torch threads", str(torch.get_num_threads()))]
    if a.synthetic or a.device == "cuda" or not lake_ok:
        rows += synthetic_rows(a)
    if not a.synthetic and lake_ok:
        home = Path(a.home or tempfile.mkdtemp(prefix="gem_bench_"))
        os.environ["GEM_HOME"] = str(home)
        make_lake(home, a.rows)
        rows.append(("loader samples/s (small, max_len 32)", f"{bench_loader(('2026-11-02', '2026-11-03'), 1024):,.0f}"))
        tr = bench_train(home, a.steps, a.device)
        rows.append(("train() samples/s (small, end to end)", f"{tr['samples_per_s']:,.0f}"))
        jp = bench_jagged_vs_padded(min(a.steps, 15), a.device)
        rows.append(("jagged model samples/s", f"{jp['jagged_samples_per_s']:,.0f}"))
        rows.append(("padded-sequence variant samples/s", f"{jp['padded_samples_per_s']:,.0f}"))
        rows.append(("jagged / padded speedup", f"{jp['speedup']:.2f}x (mean history {jp['mean_history_len']:.1f})"))
        if not a.skip_compile:
            c = bench_compile(home, a.device)
            if "error" in c:
                rows.append(("torch.compile", "failed: " + c["error"].strip().splitlines()[-1][:80]))
            else:
                rows.append(("torch.compile first step, cold cache (s)", f"{c['cold']:.1f}"))
                rows.append(("torch.compile first step, warm cache (s)", f"{c['warm']:.1f}"))
                rows.append(("cold / warm", f"{c['ratio']:.1f}x"))
                rows.append(("compiled step after warm-up (s)", f"{c['warm_later']:.2f}"))
    rows.append(("bench wall time (s)", f"{time.perf_counter() - t:.0f}"))
    print("| measure | value |\n|---|---|")
    print("\n".join(f"| {k} | {v} |" for k, v in rows))


if __name__ == "__main__":
    main()
