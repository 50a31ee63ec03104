"""Student / domain-model / adapter hyperparameters from `assets/models/students.yaml`.

The file is validated by strict models (an unknown key raises ConfigError naming the file and the key);
callers get each preset as plain dicts, {student, train, adapter, domain}.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gem_model.config import (
    ASSETS_DIR,
    SOURCES_DIR,
    ConfigError,
    _read_yaml,
    _Strict,
    _validate,
    dataset_name,
)


class StudentArch(_Strict):
    """The student's architecture (its fields are gem_model.distill.student.STUDENT_ARCH_KEYS)."""

    d_model: int | None = Field(gt=0)  # None: the teacher's d_model (parameter sharing copies tables exactly)
    hist_k: int = Field(ge=0)  # mean-pooled last k history items (0: no sequence)
    wukong_layers: int = Field(ge=0)
    wukong_k: int = Field(gt=0)
    wukong_hidden: int = Field(gt=0)
    wukong_fm_frac: float = Field(ge=0, le=1)
    hidden: int = Field(gt=0)
    teacher_emb_proj: int = Field(gt=0)
    # how dense features enter (gem_model.distill.student): layer_norm (across a row's features) | standardized
    # (per feature, the training rows' statistics); wide: standardised features also enter the heads linearly
    dense_inputs: Literal["layer_norm", "standardized"]
    wide: bool


class StudentTrain(_Strict):
    batch_size: int = Field(gt=0)
    epochs: int = Field(gt=0)
    max_steps: int | None = Field(gt=0)  # all epochs together; None: no cap
    lr: float = Field(ge=0)
    emb_lr: float = Field(ge=0)
    weight_decay: float = Field(ge=0)
    torch_threads: int | None = Field(gt=0)  # None: leave torch's setting
    kd_weight: float = Field(ge=0)
    share_tables: list[str]
    checkpoint_every: int = Field(gt=0)  # steps between resumable states (when training is given a path)
    fail_at_step: int | None = Field(default=None, gt=0)  # tests: raise after this step (after its checkpoint, if any)


class AdapterConfig(_Strict):
    l2: float = Field(ge=0)
    features: list[str]
    iters: int = Field(gt=0)


class DomainTrain(_Strict):
    batch_size: int = Field(gt=0)
    epochs: int = Field(gt=0)
    max_steps: int | None = Field(gt=0)
    lr: float = Field(ge=0)
    kd_weight: float = Field(ge=0)
    checkpoint_every: int = Field(gt=0)  # steps between resumable states (when training is given a path)
    fail_at_step: int | None = Field(default=None, gt=0)  # tests: raise after this step (after its checkpoint, if any)


class StudentPreset(_Strict):
    student: StudentArch
    train: StudentTrain
    adapter: AdapterConfig
    domain: DomainTrain


class StudentsFile(_Strict):
    presets: dict[str, StudentPreset]


class StudentsOverlay(_Strict):
    """A dataset's assets/sources/<name>/models/students.yaml: partial presets, checked once merged."""

    presets: dict[str, dict[str, Any]]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_students_file(path: Path) -> StudentsFile:
    """A full students.yaml (every preset complete), validated."""
    return _validate(StudentsFile, _read_yaml(path) or {}, path)


def _overlay(base: StudentsFile, own: Path) -> dict[str, dict[str, Any]]:
    """The dataset's presets merged on the shared ones, each validated in the name of the dataset's file."""
    overlay = _validate(StudentsOverlay, _read_yaml(own) or {}, own)
    merged = {}
    for name, over in overlay.presets.items():
        if name not in base.presets:
            raise ConfigError(
                f"{own}: field 'presets.{name}': no such preset in the shared file; known: {sorted(base.presets)}"
            )
        full = _merge(base.presets[name].model_dump(), over)
        merged[name] = _validate(StudentPreset, full, f"{own} (presets.{name})").model_dump()
    return merged


def load_student_preset(
    preset: str = "small", path: Path | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The preset's {student, train, adapter, domain} sections, deep-merged with `overrides`
    (e.g. {"train": {"max_steps": 10}}). Unknown sections or keys raise ConfigError. With GEM_DATA naming
    a dataset, assets/sources/<dataset>/models/students.yaml (same layout) is merged on top of the shared
    file's preset first."""
    path = Path(path) if path else ASSETS_DIR / "models" / "students.yaml"
    shared = load_students_file(path)
    if preset not in shared.presets:
        raise ConfigError(f"{path}: unknown preset {preset!r}; known: {sorted(shared.presets)}")
    cfg = shared.presets[preset].model_dump()
    if path == ASSETS_DIR / "models" / "students.yaml":  # the GEM_DATA dataset's adjustments, if it has any
        own = SOURCES_DIR / dataset_name() / "models" / "students.yaml"
        if own.is_file():
            cfg = _overlay(shared, own).get(preset, cfg)
    if overrides:
        where = f"{path} (overrides of preset {preset!r})"
        cfg = _validate(StudentPreset, _merge(cfg, overrides), where).model_dump()
    return {**cfg, "preset": preset}
