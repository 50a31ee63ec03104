"""A teacher's maps re-fitted as served, kept beside its checkpoint (`predict_teacher(..., refit_cache=<dir>)`).

Why: every `teacher_predictions` partition of a day before a teacher's map goes stale (the demo's first pass over
the student window, the weekly retrain's re-prediction) re-fits the stored map on the same days scored as served:
two of its three passes, each in a run of its own. What the refit gives depends on the checkpoint (the cache lives
in its version dir), the serving options and window of its config, the fitting days, whether it maps per fold
status, the surfaces scored, the precision, and the logs those passes read; the key hashes all of them, the logs
by the file list of `training_examples` (Delta names every written file anew), so an entry is never read after
any write to the table: a re-ingested day is fitted anew, never served from a stale entry.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from deltalake import DeltaTable

from gem_model.models.calibration import Calibrator
from gem_model.store.atomic import torch_save
from gem_model.store.paths import storage_options

Refit = tuple[Calibrator | None, dict[str, tuple[float, float]], dict[str, tuple[float, float]]]
SUBDIR = "served_refits"


def refit_key(config: dict[str, Any] | None, days: Sequence[dt.date], per_status: bool,
              surfaces: Sequence[str] | None, precision: str, uri: str) -> str:
    """The hex digest naming one refit (module doc); precision: the device and autocast dtype scored in."""
    cfg = config or {}
    parts = {"days": [d.isoformat() for d in days], "per_status": per_status,
             "surfaces": sorted(surfaces) if surfaces is not None else None, "precision": precision,
             "window": (cfg.get("data") or {}).get("train"),
             "item_svd": ((cfg.get("train") or {}).get("item_svd")),
             "logs": sorted(DeltaTable(uri, storage_options=storage_options(uri)).file_uris())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load_refit(cache_dir: Path, key: str) -> Refit | None:
    path = Path(cache_dir) / SUBDIR / f"{key}.pt"
    if not path.is_file():
        return None
    st = torch.load(path, map_location="cpu", weights_only=True)
    calibrator = Calibrator.from_state(st["calibrator"]) if st["calibrator"] is not None else None
    return calibrator, {k: tuple(v) for k, v in st["maps"].items()}, {k: tuple(v) for k, v in st["levels"].items()}


def save_refit(cache_dir: Path, key: str, refit: Refit) -> Path:
    """Written whole or not at all (gem_model.store.atomic): two runs of one teacher may race, each is right."""
    calibrator, maps, levels = refit
    st = {"calibrator": calibrator.state() if calibrator is not None else None,
          "maps": {k: [float(x) for x in v] for k, v in maps.items()},
          "levels": {k: [float(x) for x in v] for k, v in levels.items()}}
    return torch_save(st, Path(cache_dir) / SUBDIR / f"{key}.pt")
