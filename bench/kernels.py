"""Benchmark jagged attention against padded SDPA and torch.nested SDPA.

Run: ``python bench/kernels.py`` (``--causal`` for causal attention, ``--write-results`` to
replace this machine's ``## Kernels (GPU|CPU)`` section of ``bench/RESULTS.md``, ``--quick`` for
small shapes, e.g. the CPU dry run of bench/gpu_check.sh).

* The model's operating points (first): B=4096, H in {1, 4}, D=32, lengths uniform in [4, 68] and
  [4, 36] (the `base` preset's histories with its 4 CLS tokens), bf16 and fp32 on CUDA (fp32 and
  B=256 on CPU).  A summary table gives, per case, fwd+bwd time of the jagged kernel, its speed-up
  over padded SDPA, its ratio to the real-token floor and backward / forward.

* CUDA: the Triton kernels (``kernels.jagged_attention``), padded
  ``F.scaled_dot_product_attention`` (same real tokens padded to the max length, boolean
  key-padding mask) and ``torch.nested`` jagged-layout SDPA; B=256, H=4, D in {64, 128}, max
  length in {256, 1024, 4096}, lengths uniform in [1, max] and [1, max/5], bf16.
* Triton rows: "triton jagged" is the default dispatch (one-tile kernels up to 128 rows at D=32,
  else tiled with the fused backward), "triton tiled" the tiled kernels where the one-tile ones
  would run, "triton tiled, two-pass bwd" the deterministic backward (GEM_KERNEL_DETERMINISTIC=1),
  so the fused backward's bwd / fwd sits next to the two-pass one's, and "triton one-tile,
  batch-wide tile" the one-tile kernels with every program on the bucket's tile
  (GEM_KERNEL_SHORT_TILES=1) instead of the tile that fits its own sequence.
* ``--quick`` on CPU with ``TRITON_INTERPRET=1`` (bench/gpu_check.sh --dry-run): the Triton rows
  through the interpreter at toy sizes (one model point at B=4, a B=2 grid point), so every code
  path of the tables runs in CI; the numbers mean nothing.
* CPU (no CUDA): the PyTorch reference path vs the same two baselines at small sizes (B=32, H=2,
  D=32, max 64/256, fp32) so the script always runs; single-threaded by default (``--threads``),
  as intra-op threads make timings erratic on small, shared machines.  The reference itself pads
  and calls SDPA with a sequence mask, so its ratio to padded SDPA is the pad/unpad overhead.

FLOPs count real tokens only: forward ``sum_i L_i^2 * H * D * 4`` (two matmuls, 2 FLOPs per
multiply-add), halved when causal; backward is counted as 2.5x forward, so forward+backward is
3.5x forward.  Timings cover the attention call only (padding/unpadding of the baselines' inputs
is done outside the timed region).  "floor" is the padding-free floor: real FLOPs divided by the
throughput of padded SDPA on a full batch (every sequence at max length), i.e. what a jagged kernel
running at dense-SDPA efficiency would take.  "ratio" is time / time of the jagged kernel.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

torch._logging.set_logs(all=logging.ERROR)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import jagged_attention, jagged_to_padded  # noqa: E402
from kernels.triton import triton_jagged_attention as tja  # noqa: E402

warnings.filterwarnings("ignore")
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, device: torch.device, *, min_time: float, warmup: int = 2) -> float:
    """Median seconds per call (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples: list[float] = []
    spent = 0.0
    while spent < min_time or len(samples) < 3:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            sec = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            sec = time.perf_counter() - t0
        samples.append(sec)
        spent += sec
        if len(samples) >= 200:
            break
    return statistics.median(samples)


def make_lengths(batch: int, max_len: int, hi: int, gen: torch.Generator, lo: int = 1) -> torch.Tensor:
    lengths = torch.randint(lo, hi + 1, (batch,), generator=gen)
    lengths[0] = max_len  # the padded baselines always pad to max_len
    return lengths


def attention_flops(lengths: torch.Tensor, heads: int, dim: int, causal: bool) -> float:
    flops = float((lengths.double() ** 2).sum()) * heads * dim * 4
    return flops / 2 if causal else flops


class Case:
    """Inputs of one configuration in the three layouts."""

    def __init__(self, lengths, heads, dim, dtype, device, causal, gen):
        self.lengths, self.heads, self.dim, self.causal = lengths, heads, dim, causal
        self.device = device
        self.max_len = int(lengths.max())
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        self.offsets = offsets.to(device)
        total = int(offsets[-1])
        base = [torch.randn(total, heads, dim, generator=gen).to(device, dtype) for _ in range(3)]
        self.jagged = [t.clone().requires_grad_() for t in base]
        self.grad_jagged = torch.randn(total, heads, dim, generator=gen).to(device, dtype)
        # Padded [B, H, N, D] leaves, key-padding mask [B, 1, 1, N] (True = attend).
        self.padded = [
            jagged_to_padded(t, self.offsets, self.max_len).transpose(1, 2).contiguous().requires_grad_()
            for t in base
        ]
        self.grad_padded = jagged_to_padded(self.grad_jagged, self.offsets, self.max_len).transpose(1, 2)
        idx = torch.arange(self.max_len, device=device)
        # Non-causal: key-padding mask [B, 1, 1, N] (True = attend).  Causal: with right padding
        # the causal mask alone already hides padded keys from every real query, so use
        # is_causal (the fast path) and no mask; padded query rows are ignored.
        self.mask = None if causal else (idx[None, :] < lengths.to(device)[:, None])[:, None, None, :]
        self.nested_values = [t.clone().requires_grad_() for t in base]

    def run_jagged(self, backward: bool):
        q, k, v = self.jagged
        out = jagged_attention(q, k, v, self.offsets, causal=self.causal, max_len=self.max_len)  # no read-back
        if backward:
            out.backward(self.grad_jagged)
        return out

    def run_padded(self, backward: bool):
        q, k, v = self.padded
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal)
        if backward:
            out.backward(self.grad_padded)
        return out

    def run_nested(self, backward: bool):
        if self.causal:
            raise NotImplementedError("torch.nested SDPA does not support is_causal=True")
        q, k, v = (
            torch.nested.nested_tensor_from_jagged(t, self.offsets).transpose(1, 2)
            for t in self.nested_values
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        if backward:
            grad = torch.nested.nested_tensor_from_jagged(self.grad_jagged, self.offsets).transpose(1, 2)
            out.backward(grad)
        return out


def dense_throughput(batch, max_len, heads, dim, dtype, device, causal, min_time, gen) -> tuple[float, float]:
    """FLOP/s of padded SDPA (no mask) on a full batch at max_len: (forward, forward+backward)."""
    q, k, v = (
        torch.randn(batch, heads, max_len, dim, generator=gen).to(device, dtype).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(batch, heads, max_len, dim, generator=gen).to(device, dtype)
    flops = batch * max_len**2 * heads * dim * 4 / (2 if causal else 1)

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)

    t_f = time_fn(fwd, device, min_time=min_time)
    t_fb = time_fn(fwd_bwd, device, min_time=min_time)
    return flops / t_f, 3.5 * flops / t_fb


SUMMARY_HEADER = [
    "| case | dtype | jagged fwd ms | jagged fwd+bwd ms | bwd / fwd | padded fwd+bwd ms | speed-up vs padded | "
    "floor fwd+bwd ms | jagged / floor |",
    "|---|---|---|---|---|---|---|---|---|",
]


def measure(lengths, heads, dim, dtype, device, causal, min_time, gen, impl_name, dense) -> dict[str, tuple]:
    """{impl: (fwd s, fwd+bwd s)} for the jagged kernel, the baselines and the real-token floor."""
    flops = attention_flops(lengths, heads, dim, causal)
    case = Case(lengths, heads, dim, dtype, device, causal, gen)
    results = {}
    impls = [(impl_name, case.run_jagged), ("padded SDPA", case.run_padded), ("nested SDPA", case.run_nested)]
    if impl_name != REFERENCE:
        # the deterministic two-pass backward (7 dots per tile) next to the fused one (5), and the
        # tiled kernels where the one-tile ones would run
        impls.insert(1, (TWO_PASS, lambda backward, run=case.run_jagged: _with_env(
            run, backward, GEM_KERNEL_SHORT_MAX="0", GEM_KERNEL_DETERMINISTIC="1")))
        if case.max_len <= tja.short_rows(dim, dtype):
            impls.insert(1, (TILED, lambda backward, run=case.run_jagged: _with_env(
                run, backward, GEM_KERNEL_SHORT_MAX="0", GEM_KERNEL_DETERMINISTIC="0")))
            impls.insert(1, (BATCH_TILE, lambda backward, run=case.run_jagged: _with_env(
                run, backward, GEM_KERNEL_SHORT_TILES="1")))
    for name, fn in impls:
        try:
            t_f = time_fn(lambda fn=fn: fn(False), device, min_time=min_time)
            t_fb = time_fn(lambda fn=fn: fn(True), device, min_time=min_time)
        except Exception as exc:  # a baseline unsupported on this build/device
            print(f"  {name} skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
            t_f = t_fb = float("nan")
        results[name] = (t_f, t_fb)
    dense_f, dense_fb = dense
    results["floor"] = (flops / dense_f, 3.5 * flops / dense_fb)
    del case
    return results


TILED = "triton tiled"
TWO_PASS = "triton tiled, two-pass bwd"
BATCH_TILE = "triton one-tile, batch-wide tile"
REFERENCE = "torch reference"
INTERPRETED = "triton jagged (interpreted)"


def _with_env(run, backward: bool, **env: str):
    """Run with kernel switches set (GEM_KERNEL_SHORT_MAX=0: no one-tile kernels;
    GEM_KERNEL_DETERMINISTIC=1: the two-pass backward), restored afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run(backward)
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def summary_line(label: str, dtype: torch.dtype, res: dict[str, tuple], impl_name: str) -> str:
    (j_f, j_fb), (_, p_fb), (_, fl_fb) = res[impl_name], res["padded SDPA"], res["floor"]
    return (f"| {label} | {str(dtype).replace('torch.', '')} | {j_f * 1e3:.3f} | {j_fb * 1e3:.3f} | "
            f"{(j_fb - j_f) / j_f:.2f} | {p_fb * 1e3:.3f} | {p_fb / j_fb:.2f}x | {fl_fb * 1e3:.3f} | {j_fb / fl_fb:.2f}x |")


def run_model_points(args, device, impl_name, gen) -> list[str]:
    """The model's own shapes: B=4096, H in {1, 4}, D=32, lengths U[4, 68] and U[4, 36]."""
    cuda = device.type == "cuda"
    batch = 4096 if cuda else (32 if args.quick else 256)
    if impl_name == INTERPRETED:
        batch = 4  # Triton's CPU interpreter: only the code path is exercised, not the speed
    dtypes = (torch.bfloat16, torch.float32) if cuda else (torch.float32,)
    min_time = 0.2 if cuda else 0.05
    lines = []
    points = [(1, 36)] if impl_name == INTERPRETED else [(1, 68), (1, 36), (4, 68), (4, 36)]
    for dtype in dtypes:
        for heads, hi in points:
            dense = dense_throughput(batch, hi, heads, 32, dtype, device, args.causal, min_time, gen)
            lengths = make_lengths(batch, hi, hi, gen, lo=4)
            res = measure(lengths, heads, 32, dtype, device, args.causal, min_time, gen, impl_name, dense)
            point = [summary_line(f"model B={batch} H={heads} D=32 U[4,{hi}]", dtype, res, impl_name)]
            for variant in (BATCH_TILE, TILED, TWO_PASS):
                if variant in res:
                    point.append(summary_line(f"model B={batch} H={heads} D=32 U[4,{hi}], {variant}", dtype,
                                              res, variant))
            print("\n".join(point), file=sys.stderr, flush=True)  # kept when a time limit kills the run
            lines += point
    return lines


def run(args) -> list[str]:
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        batch, heads, dims, max_lens, dtype, min_time = (
            256,
            4,
            (64, 128),
            (256, 1024, 4096),
            torch.bfloat16,
            0.2,
        )
        impl_name = "triton jagged"
    else:
        batch, heads, dims, max_lens, dtype, min_time = 32, 2, (32,), (64, 256), torch.float32, 0.15
        impl_name = REFERENCE
        if args.quick and tja.interpreting():  # the dry run: every Triton row of the tables, interpreted
            os.environ["GEM_KERNEL_BACKEND"] = "triton"
            impl_name = INTERPRETED
    if args.quick:
        batch, dims, max_lens, min_time = min(batch, 8), dims[:1], max_lens[:1], 0.02
    if impl_name == INTERPRETED:
        batch, max_lens, min_time = 2, (24,), 0.0
    gen = torch.Generator().manual_seed(0)
    print("\n".join(SUMMARY_HEADER), file=sys.stderr, flush=True)
    summary = [*SUMMARY_HEADER, *run_model_points(args, device, impl_name, gen)]
    if args.model_only:
        return ["Summary (the model's operating points)", "", *summary]
    lines = [
        f"device: {torch.cuda.get_device_name(device) if cuda else platform.processor() or 'cpu'}; "
        f"torch {torch.__version__}; B={batch}, H={heads}, {str(dtype).replace('torch.', '')}, "
        f"causal={args.causal}; fwd+bwd FLOPs = 3.5x fwd; TFLOP/s on real tokens only"
        + ("" if cuda else f"; torch threads={torch.get_num_threads()}, load average {_loadavg()}"),
        "",
        "| D | max len | lengths | impl | fwd ms | fwd TFLOP/s | fwd ratio | fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dim in dims:
        for max_len in max_lens:
            dense = dense_throughput(batch, max_len, heads, dim, dtype, device, args.causal, min_time, gen)
            for label, hi in (("U[1,max]", max_len), ("U[1,max/5]", max(1, max_len // 5))):
                lengths = make_lengths(batch, max_len, hi, gen)
                flops = attention_flops(lengths, heads, dim, args.causal)
                results = measure(lengths, heads, dim, dtype, device, args.causal, min_time, gen, impl_name, dense)
                ref_f, ref_fb = results[impl_name]
                for name, (t_f, t_fb) in results.items():
                    lines.append(
                        f"| {dim} | {max_len} | {label} | {name} | {t_f * 1e3:.3f} | {flops / t_f / 1e12:.4g} | "
                        f"{t_f / ref_f:.2f} | {t_fb * 1e3:.3f} | {3.5 * flops / t_fb / 1e12:.4g} | {t_fb / ref_fb:.2f} |"
                    )
                summary.append(summary_line(f"grid B={batch} H={heads} D={dim} max {max_len} {label}", dtype,
                                            results, impl_name))
                print("\n".join(lines[-4:]) if len(lines) > 4 else "", file=sys.stderr, flush=True)
    note = ("bwd / fwd = (fwd+bwd - fwd) / fwd; floor = real-token FLOPs at dense SDPA throughput; "
            "jagged / floor: how far the kernel is from it (goal <= 2x); speed-up vs padded: goal >= 2x "
            "at mean/max 0.5, >= 5x at 0.1")
    return [*lines, "", "Summary (the model's operating points first):", "", *summary, "", note]


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def machine_description(cuda: bool) -> str:
    if cuda:
        return f"GPU: {torch.cuda.get_device_name()}"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return "\n".join(lscpu.splitlines()[:10])
    except (OSError, subprocess.SubprocessError):
        return platform.platform()


def write_section(heading: str, body: str) -> None:
    """Add or replace ``heading``'s section (up to the next ``## `` heading) in RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    section = [heading, "", *body.rstrip().splitlines(), ""]
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    else:
        if lines and lines[-1].strip():
            lines.append("")
        lines.extend(section)
    RESULTS.write_text("\n".join(lines).rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--causal", action="store_true", help="benchmark causal attention")
    parser.add_argument("--cpu", action="store_true", help="run the CPU comparison even if CUDA is present")
    parser.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads for the CPU comparison (default 1)"
    )
    parser.add_argument("--quick", action="store_true", help="small grid (dry runs)")
    parser.add_argument("--model-only", action="store_true", help="the model's operating points, no grid")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    table = run(args)
    print("\n".join(table))
    print(f"\n(total {time.perf_counter() - t0:.1f} s)")
    if args.write_results:
        heading = "## Kernels (GPU)" if cuda else "## Kernels (CPU)"
        body = ["Machine:", "", "```", machine_description(cuda), "```", "", *table]
        if not cuda:
            body += ["", "GPU: not lent in this session; run `python bench/kernels.py` on a CUDA machine."]
        write_section(heading, "\n".join(body))


if __name__ == "__main__":
    main()
