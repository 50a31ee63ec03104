"""Student vs teacher on CPU: file size, single-request and batch-512 latency (< 1 minute).

    python bench/students.py [--preset small] [--teacher-preset small] [--threads 1]

The teacher is a GEM built from assets/models/<teacher-preset>.yaml, the student from
assets/models/students.yaml <preset> (untrained weights: latency and size do not depend on them).
Inputs are real encoded rows of a synthetic training_examples day. The student is timed both
eager and as its torch.export program (what serving loads).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

# bench/kernels.py would shadow the `kernels` package when this file runs as a script
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if p not in ("", _HERE)] + [str(Path(_HERE).parent)]

from gem_model.config import ASSETS_DIR, load_features, load_surfaces  # noqa: E402
from gem_model.data.loader import Encoder  # noqa: E402
from gem_model.data.synthetic import synthetic_day  # noqa: E402
from gem_model.distill import Student, export_student, load_student_preset, student_config  # noqa: E402
from gem_model.distill.dataset import last_k  # noqa: E402
from gem_model.models import GEMConfig, build_model  # noqa: E402


def timeit(fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds per call."""
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def size_mb(obj) -> float:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--teacher-preset", default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    features, surfaces = load_features(), load_surfaces()
    dims = yaml.safe_load((ASSETS_DIR / "models" / f"{args.teacher_preset}.yaml").read_text())["model"]
    teacher = build_model(GEMConfig.from_specs(dims)).eval()
    hp = load_student_preset(args.preset)
    df, _ = synthetic_day(dt.date(2026, 11, 2), 512, surfaces=surfaces, seed=0)
    enc = Encoder(features, surfaces, teacher.cfg.seq_len)
    batch = enc.encode(df).to_batch()
    one = enc.encode(df.head(1)).to_batch()
    hist_col = next(c.name for c in features.history.columns if c.source == "item_id")

    def student_args(b, student):
        a = [b.dense, b.sparse]
        if student.hist_k:
            a.append(last_k(b.offsets, b.history[hist_col], student.hist_k))
        if student.teacher_emb_dim:
            a.append(torch.randn(len(b), student.teacher_emb_dim))
        return tuple(a)

    rows = []
    tbytes = size_mb({"model": teacher.state_dict()})
    rows.append(("teacher (GEM, eager)", sum(p.numel() for p in teacher.parameters()), tbytes,
                 timeit(lambda: teacher(one), args.repeats), timeit(lambda: teacher(batch), max(5, args.repeats // 4))))
    with tempfile.TemporaryDirectory() as tmp:
        for name, emb_dim in (("student", 0), ("student + teacher emb", teacher.cfg.summary_dim)):
            cfg = student_config(hp["student"], features=features, teacher_d_model=teacher.cfg.d_model, surface="feed",
                                 tasks=["click", "conversion"], aux_head=True, teacher_emb_dim=emb_dim)
            student = Student(cfg).eval()
            path = export_student(student, Path(tmp) / f"{name.replace(' ', '_')}.pt2")
            served = torch.export.load(str(path)).module()
            a1, a512 = student_args(one, student), student_args(batch, student)
            n = sum(p.numel() for p in student.parameters())
            rows.append((f"{name} (eager)", n, size_mb({"state_dict": student.state_dict()}),
                         timeit(lambda s=student, a=a1: s(*a), args.repeats), timeit(lambda s=student, a=a512: s(*a), args.repeats)))
            rows.append((f"{name} (.pt2)", n, path.stat().st_size / 2**20,
                         timeit(lambda s=served, a=a1: s(*a), args.repeats), timeit(lambda s=served, a=a512: s(*a), args.repeats)))

    print(f"CPU threads={args.threads}  teacher preset={args.teacher_preset}  student preset={args.preset}")
    print(f"{'model':<32} {'params':>10} {'file MB':>8} {'1 req ms':>9} {'512 ms':>8} {'512 vs teacher':>15}")
    t512 = rows[0][4]
    for name, n, mb, l1, l512 in rows:
        print(f"{name:<32} {n:>10,} {mb:>8.2f} {l1:>9.2f} {l512:>8.2f} {t512 / l512:>14.1f}x")
    # the dense (non-embedding) compute is what serving pays per request
    dense = {"teacher": teacher.param_counts()["dense"]}
    print(f"teacher dense params {dense['teacher']:,}; embedding rows are shared/looked up, not computed")


if __name__ == "__main__":
    main()
