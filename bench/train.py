"""Training benchmarks on CPU (or GPU with --device cuda); prints ratios side by side, never pass/fail.

    python bench/train.py [--rows 20000] [--steps 30] [--device cpu] [--skip-compile]

1. samples/s of the `small` preset: the loader alone, and train() end to end;
2. the jagged model vs its padded-sequence variant (same weights, same batches): step time ratio;
3. torch.compile (GEM.compile_dense, as train() does): cold start (empty inductor cache) vs warm
   start (the same cache), each in a fresh process, time to the first compiled training step.
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
    from gem_model.synthetic import write_synthetic_lake

    if not (home / "lake" / "training_examples").exists():
        write_synthetic_lake(str(home / "lake"), [START + dt.timedelta(days=i) for i in range(4)], rows, max_hist=96)


def bench_loader(rows_days: tuple[str, str], batch_size: int) -> float:
    from gem_model.data import ExampleStream

    s = ExampleStream(*rows_days, batch_size=batch_size, max_len=32)
    t, n = time.perf_counter(), 0
    for b in s:
        n += len(b)
    return n / (time.perf_counter() - t)


def bench_train(home: Path, steps: int, device: str) -> dict:
    from gem_model.train import train

    out = home / "bench_small"
    s = train({"preset": "small", "device": device, "out_dir": str(out),
               "data": {"train": ["2026-11-02", "2026-11-03"], "valid": None, "eval": None},
               "train": {"max_steps": steps, "log_every": max(1, steps // 3)}})
    return {"samples_per_s": s["samples_per_s"], "steps": s["step"]}


def bench_jagged_vs_padded(steps: int, device: str) -> dict:
    import torch

    from gem_model.data import ExampleStream
    from gem_model.models import GEM, GEMConfig
    from gem_model.train import load_preset

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
from gem_model.data import ExampleStream
from gem_model.models import GEM, GEMConfig
from gem_model.train import load_preset
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000, help="synthetic rows per day")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--home", default=None, help="GEM_HOME for the bench (default: a temp dir)")
    ap.add_argument("--skip-compile", action="store_true")
    a = ap.parse_args()
    home = Path(a.home or tempfile.mkdtemp(prefix="gem_bench_"))
    os.environ["GEM_HOME"] = str(home)
    import torch

    make_lake(home, a.rows)
    rows: list[tuple[str, str]] = [("device", a.device), ("torch threads", str(torch.get_num_threads()))]
    t = time.perf_counter()
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
    w = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{w}}  {v}" for k, v in rows))


if __name__ == "__main__":
    main()
