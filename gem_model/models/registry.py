"""Model versions on disk: $GEM_HOME/models/<asset>/[<partition>/]<version>/ and the ACCEPTED pointer.

A version directory holds model.pt (the selected weights + model config), checkpoint.pt (full
resumable state), metrics.json and config.json. ACCEPTED (one line: a version) is written only by
the quality gate; everything downstream reads the ACCEPTED version.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from pathlib import Path
from typing import Any

import torch

from gem_model.models import GEM, GEMConfig
from gem_model.models.calibration import Calibrator
from gem_model.store import atomic
from gem_model.store.paths import models_dir

ACCEPTED = "ACCEPTED"
MODEL_FILE = "model.pt"
_VERSION_RE = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9]{6}$")


def run_tag(run_id: str | None) -> str:
    """The 6 characters a version takes from its run's id: the id's first letters and digits, random-padded
    (an id with fewer gives a tag no later run matches)."""
    return (re.sub(r"[^a-z0-9]", "", (run_id or "").lower())[:6] + secrets.token_hex(3))[:6]


def new_version(run_id: str | None = None, now: dt.datetime | None = None) -> str:
    """UTC time + the run's tag, e.g. 20261129T153000Z-ab12cd."""
    now = now or dt.datetime.now(dt.UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{run_tag(run_id)}"


def version_dir(asset: str, version: str, partition: str | None = None, home: Path | None = None) -> Path:
    if not _VERSION_RE.match(version):
        raise ValueError(f"version {version!r} is not <UTC time>-<run id>, e.g. 20261129T153000Z-ab12cd")
    return models_dir(asset, partition, home) / version


def list_versions(asset: str, partition: str | None = None) -> list[str]:
    base = models_dir(asset, partition)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and _VERSION_RE.match(p.name))


def read_accepted(asset: str, partition: str | None = None) -> Path | None:
    """The ACCEPTED version's directory, or None when nothing was accepted (or it vanished)."""
    f = models_dir(asset, partition) / ACCEPTED
    if not (version := f.read_text().strip() if f.exists() else ""):
        return None
    d = version_dir(asset, version, partition)
    return d if d.is_dir() else None


def write_accepted(asset: str, version: str, partition: str | None = None) -> Path:
    """Point ACCEPTED at `version` (atomically)."""
    d = version_dir(asset, version, partition)
    if not d.is_dir():
        raise FileNotFoundError(f"{d} does not exist: cannot accept a version that was never written")
    return atomic.write_text(d.parent / ACCEPTED, version + "\n")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a version directory (its model.pt)."""
    p = Path(path)
    if p.is_dir():
        for name in (MODEL_FILE, "checkpoint.pt"):
            if (p / name).exists():
                return p / name
        raise FileNotFoundError(f"{p} holds neither {MODEL_FILE} nor checkpoint.pt")
    return p


def load_model(checkpoint_path: str | Path, device: str | torch.device = "cpu") -> tuple[GEM, dict[str, Any]]:
    """(model in eval mode, its train config dict plus "model_config"); loads with weights_only=True."""
    path = resolve_checkpoint(checkpoint_path)
    ck = torch.load(path, map_location="cpu", weights_only=True)
    mcfg = GEMConfig.from_dict(ck["model_config"])
    model = GEM(mcfg)
    model.load_state_dict(ck["model"])
    if ck.get("calibration"):  # the post-hoc calibrator fitted on E-1 (gem_model.models.calibration)
        model.calibrator = Calibrator.from_state(ck["calibration"])
    model.to(device).eval()
    return model, {**(ck.get("config") or {}), "model_config": mcfg.to_dict()}
