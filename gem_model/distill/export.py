"""Serving export: a student as a `torch.export` program over plain tensors.

    inputs : dense [B, m] float32, sparse [B, n] int64 (hashed ids, features.yaml order),
             hist_ids [B, hist_k] int64 (last hist_k history item ids, most recent first, 0 = pad;
             present when hist_k > 0), teacher_emb [B, E] float32 (representation students only)
    output : probabilities [B, 2] (click, conversion) of the serving head, through the student's own
             calibrator when it carries one (sigmoid(a * logit + b); a, b in the sidecar too)

A serving system loads the `.pt2` with `torch.export.load(path).module()` without our code; the
input names and shapes are in the `<path>.json` sidecar.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from gem_model.distill.student import Student
from gem_model.store.atomic import atomic_path, write_json


class ServingStudent(nn.Module):
    def __init__(self, student: Student):
        super().__init__()
        self.student = student
        cal = getattr(student, "calibrator", None)  # gem_model.distill.trainer.fit_student_calibrator
        self.register_buffer("cal_a", cal.a[0].float().clone() if cal is not None else torch.ones(2))
        self.register_buffer("cal_b", cal.b[0].float().clone() if cal is not None else torch.zeros(2))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        more = iter(rest)
        hist = next(more) if self.student.hist_k > 0 else None
        teacher = next(more) if self.student.teacher_emb_dim > 0 else None
        return torch.sigmoid(self.cal_a * self.student(dense, sparse, hist, teacher) + self.cal_b)


def _inputs(student: Student, batch: int) -> dict[str, torch.Tensor]:
    cfg = student.cfg
    rows = min(int(cfg["tables"][t]) for _, t in cfg["sparse_features"])
    out = {"dense": torch.zeros(batch, len(cfg["dense_features"])),
           "sparse": torch.randint(0, rows, (batch, len(cfg["sparse_features"])))}
    if student.hist_k > 0:
        out["hist_ids"] = torch.randint(0, int(cfg["tables"][cfg["hist_table"]]), (batch, student.hist_k))
    if student.teacher_emb_dim > 0:
        out["teacher_emb"] = torch.randn(batch, student.teacher_emb_dim)
    return out


def example_inputs(student: Student, batch: int = 4) -> tuple[torch.Tensor, ...]:
    return tuple(_inputs(student, batch).values())


def export_student(model: Student, path: str | Path) -> Path:
    """Export the serving path of `model` (eval mode, CPU) to `path` (.pt2) with a dynamic batch
    dimension; writes `<path>.json` describing the inputs. Returns the path."""
    path = Path(path)
    wrapper = ServingStudent(model).eval().cpu()
    inputs = _inputs(model, 4)
    args = tuple(inputs.values())
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    dyn = {"dense": {0: batch}, "sparse": {0: batch}, "rest": tuple({0: batch} for _ in args[2:])}
    with torch.no_grad():
        ep = torch.export.export(wrapper, args, dynamic_shapes=dyn, strict=False)
    with atomic_path(path) as tmp:
        torch.export.save(ep, tmp)
    meta = {
        "inputs": [
            {"name": n, "shape": ["B", *list(a.shape[1:])], "dtype": str(a.dtype).replace("torch.", "")}
            for n, a in inputs.items()
        ],
        "output": {"name": "probabilities", "shape": ["B", 2], "tasks": ["click", "conversion"]},
        "surface": model.cfg.get("surface"),
        "calibration": {"a": wrapper.cal_a.tolist(), "b": wrapper.cal_b.tolist(),
                        "fit_day": getattr(getattr(model, "calibrator", None), "fit_day", None)},
    }
    write_json(Path(str(path) + ".json"), meta)
    return path
