"""Students train on the accelerator resource's device and precision: the Dagster asset passes
them through to the trainer, which moves the model and every minibatch there (spied here: this
machine has only a CPU) and autocasts the forward."""

from __future__ import annotations

import dagster as dg
import numpy as np
import pytest
import torch

from gem_model.config import load_features
from gem_model.data.loader import date_range
from gem_model.distill import Student, load_examples, load_student_preset, student_config
from gem_model.distill.dataset import StudentData
from gem_model.distill.trainer import predict_student, train_student

from .distill_fixtures import TINY, world  # noqa: F401

SURFACE = "feed"


@pytest.fixture(scope="module")
def setup(world):  # noqa: F811
    preset = load_student_preset("tiny", overrides=TINY)
    data = load_examples(date_range(*world.roles.student), [SURFACE], hist_k=8, uri=world.te_uri)
    cfg = student_config(preset["student"], features=load_features(), teacher_d_model=32, surface=SURFACE,
                         tasks=["click", "conversion"], aux_head=False, teacher_emb_dim=0)
    return preset, data, cfg


def test_student_data_to_moves_every_tensor():
    data = StudentData(dense=torch.zeros(2, 3), sparse=torch.zeros(2, 1, dtype=torch.long),
                       hist_ids=torch.zeros(2, 4, dtype=torch.long), surface_idx=torch.zeros(2, dtype=torch.long),
                       labels=torch.zeros(2, 2), label_mask=torch.ones(2, 2, dtype=torch.bool),
                       request_ids=np.array(["a", "b"], dtype=object), dates=np.array(["2026-11-01"] * 2,
                                                                                       dtype="datetime64[D]"))
    moved = data.to("meta")
    assert all(t.device.type == "meta" for t in (moved.dense, moved.sparse, moved.hist_ids, moved.labels,
                                                  moved.label_mask, moved.surface_idx))
    assert moved.teacher_p is None and moved.request_ids is data.request_ids


def test_student_trains_on_the_requested_device(setup, monkeypatch):
    preset, data, cfg = setup
    model = Student(cfg)
    target = torch.device("cuda", 0)
    model_moves: list[torch.device] = []
    model.to = lambda device: (model_moves.append(torch.device(device)), model)[1]  # no CUDA here: record only
    batch_moves: list[torch.device] = []

    def fake_to(self, device):
        batch_moves.append(torch.device(device))
        return self

    monkeypatch.setattr(StudentData, "to", fake_to)
    info = train_student(model, data, None, "labels_only", {**preset["train"], "epochs": 1, "max_steps": 3},
                         device=target, precision="fp32")
    assert info["steps"] == 3
    assert model_moves == [target, torch.device("cpu")]  # trained there, handed back where it was
    assert batch_moves == [target] * 3  # every minibatch on the training device


def test_student_forward_autocasts_in_the_requested_precision(setup, monkeypatch):
    preset, data, cfg = setup
    seen: list[tuple[bool, torch.dtype]] = []
    forward = Student.forward_train

    def spy(self, *args):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return forward(self, *args)

    monkeypatch.setattr(Student, "forward_train", spy)
    for precision, expected in (("bf16", (True, torch.bfloat16)), ("fp32", (False, None))):
        seen.clear()
        model = Student(cfg)
        info = train_student(model, data, None, "labels_only", {**preset["train"], "epochs": 1, "max_steps": 2},
                             device="cpu", precision=precision)
        assert len(seen) == 2 and np.isfinite(info["losses"]).all()
        assert all(s[0] == expected[0] and (expected[1] is None or s[1] == expected[1]) for s in seen)
    p = predict_student(model, data.take(np.arange(5)))
    assert p.shape == (5, 2) and p.dtype == np.float32


@pytest.mark.parametrize("device, precision", [("cuda", "bf16"), ("cpu", "fp32")])
def test_distillation_report_asset_passes_the_accelerator_device(monkeypatch, tmp_path, device, precision):
    import gem_model.distill as distill
    from gem_pipelines.assets import students as assets
    from gem_pipelines.resources import AcceleratorResource, LakeResource, WandbResource

    calls: list[dict] = []
    monkeypatch.setenv("GEM_HOME", str(tmp_path))
    monkeypatch.setattr(assets, "accepted_teachers", lambda day=None: {"foundation": ("ckpt", "v1")})
    monkeypatch.setattr(assets, "_accepted_foundation", lambda: ("ckpt", "v1"))
    def run_distillation(*_, **kw):  # leaves a student's checkpoint, as a run does
        kw["checkpoint_dir"].mkdir(parents=True)
        (kw["checkpoint_dir"] / "student.pt").write_bytes(b"state")
        calls.append(kw)
        return []

    monkeypatch.setattr(distill, "run_distillation", run_distillation)
    monkeypatch.setattr(distill, "write_report", lambda rows, path, **_: path)
    monkeypatch.setattr(assets, "distillation_table", lambda rows: "")
    monkeypatch.setattr(assets, "distillation_plot", lambda rows: "")
    monkeypatch.setattr(assets, "distillation_page", lambda path: path)
    accelerator = AcceleratorResource(device=device, precision="bf16")
    assert dg.materialize([assets.distillation_report], resources={
        "lake": LakeResource(root=str(tmp_path / "lake")), "wandb": WandbResource(mode="disabled"),
        "accelerator": accelerator}).success  # a run: the asset keys its students' checkpoints by the run's lineage
    assert len(calls) == 1
    assert calls[0]["device"] == device and calls[0]["precision"] == precision
    assert calls[0]["checkpoint_dir"].parent == tmp_path / "models" / "distillation_report"  # GEM_HOME, not reports/
    assert not calls[0]["checkpoint_dir"].parent.exists()  # the report written, no checkpoint nor its folder is left
