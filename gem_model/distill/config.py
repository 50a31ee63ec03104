"""Student / domain-model / adapter hyperparameters from `assets/models/students.yaml` (plain dicts)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gem_model.config import ASSETS_DIR, SOURCES_DIR, ConfigError, dataset_name

SECTIONS = ("student", "train", "adapter", "domain")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_student_preset(
    preset: str = "small", path: Path | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The preset's {student, train, adapter, domain} sections, deep-merged with `overrides`
    (e.g. {"train": {"max_steps": 10}}). Unknown sections or keys raise ConfigError. With GEM_DATA naming
    a dataset, assets/sources/<dataset>/models/students.yaml (same layout) is merged on top of the shared
    file's preset first."""
    path = Path(path) if path else ASSETS_DIR / "models" / "students.yaml"
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: file not found") from e
    presets = (raw or {}).get("presets") or {}
    if preset not in presets:
        raise ConfigError(f"{path}: unknown preset {preset!r}; known: {sorted(presets)}")
    cfg = presets[preset]
    if path == ASSETS_DIR / "models" / "students.yaml":  # the GEM_DATA dataset's adjustments, if it has any
        own = SOURCES_DIR / dataset_name() / "models" / "students.yaml"
        if own.is_file():
            cfg = _merge(cfg, ((yaml.safe_load(own.read_text()) or {}).get("presets") or {}).get(preset) or {})
    for section, values in (overrides or {}).items():
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section {section!r} in overrides; known: {SECTIONS}")
        unknown = set(values) - set(cfg.get(section, {}))
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)} in overrides of '{section}'")
    out = _merge(cfg, overrides or {})
    out["preset"] = preset
    return out
