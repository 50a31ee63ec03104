"""A student's warm start keeps the rows its old data reached and folds the item rows its new window
meets for the first time into them (gem_model.distill.warm_start.fold_in_student), as the teacher's
warm retrain does; the rows reached are saved with the student and grow with each warm start."""

from __future__ import annotations

import numpy as np
import torch

from gem_model.config import load_features
from gem_model.distill import load_student_preset, student_config
from gem_model.distill.dataset import StudentData
from gem_model.distill.student import Student
from gem_model.distill.trainer import load_student, save_student, table_rows
from gem_model.distill.warm_start import warm_start

N_TOPICS, PER_TOPIC, K = 4, 12, 8
FIRST_AD = 1 + N_TOPICS * PER_TOPIC
NEW_AD = FIRST_AD + N_TOPICS


def _student() -> Student:
    preset = load_student_preset("tiny")
    cfg = student_config(preset["student"], features=load_features(), teacher_d_model=16, surface="feed",
                         tasks=["click", "conversion"])
    cfg.update(arm="labels_only", path="none", teacher=None, seed=0)
    return Student(cfg)


def _data(model: Student, first_ad: int, rows: int = 256, seed: int = 0) -> StudentData:
    """Each row's history holds items of one topic; its ad is that topic's ad (first_ad + topic)."""
    g = torch.Generator().manual_seed(seed)
    topic = torch.randint(0, N_TOPICS, (rows,), generator=g)
    hist = 1 + topic[:, None] * PER_TOPIC + torch.randint(0, PER_TOPIC, (rows, K), generator=g)
    names = [n for n, _ in model.cfg["sparse_features"]]
    sparse = torch.ones(rows, len(names), dtype=torch.long)
    sparse[:, names.index("ad_id")] = first_ad + topic
    return StudentData(dense=torch.zeros(rows, len(model.cfg["dense_features"])), sparse=sparse, hist_ids=hist,
                       surface_idx=torch.zeros(rows, dtype=torch.long), labels=torch.zeros(rows, 2),
                       label_mask=torch.ones(rows, 2, dtype=torch.bool), request_ids=np.arange(rows).astype(str).astype(object),
                       dates=np.full(rows, np.datetime64("2026-11-02", "D")))


def test_a_warm_student_folds_new_ads_into_the_rows_it_knew(tmp_path):
    torch.manual_seed(0)
    old = _student()
    old.seen_rows = table_rows(old, _data(old, FIRST_AD))
    save_student(old, tmp_path / "v1")
    assert torch.equal(load_student(tmp_path / "v1").state_dict()["tables.item.weight"], old.tables["item"].weight)

    new = _student()
    window = _data(new, NEW_AD, seed=1)  # the same items, N_TOPICS ads never seen before
    info = warm_start(new, tmp_path / "v1", window)
    assert info["warm_start"] == "warm" and info["folded_in"] == N_TOPICS
    w, w0 = new.tables["item"].weight.detach(), old.tables["item"].weight.detach()
    fresh = torch.arange(NEW_AD, NEW_AD + N_TOPICS)
    keep = torch.ones(len(w), dtype=torch.bool)
    keep[fresh] = False
    assert torch.equal(w[keep], w0[keep])  # every other row as the old student left it
    items = torch.nn.functional.normalize(w0[1:FIRST_AD].reshape(N_TOPICS, PER_TOPIC, -1).mean(1), dim=1)
    cos = torch.nn.functional.normalize(w[fresh], dim=1) @ items.T
    assert torch.equal(cos.argmax(1), torch.arange(N_TOPICS)), cos
    assert torch.equal(new.seen_rows["item"], old.seen_rows["item"])  # training adds the window's rows


def test_a_student_saved_without_seen_rows_warm_starts_without_folding(tmp_path):
    torch.manual_seed(0)
    old = _student()
    save_student(old, tmp_path / "v1")
    new = _student()
    info = warm_start(new, tmp_path / "v1", _data(new, NEW_AD))
    assert info == {"warm_start_from": str(tmp_path / "v1"), "warm_start": "warm"}
    assert all(torch.equal(v, old.state_dict()[k]) for k, v in new.state_dict().items())
