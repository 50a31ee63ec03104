"""A tiny Weights & Biases wrapper: offline under $GEM_HOME/wandb by default, online with
WANDB_API_KEY, a no-op with WANDB_MODE=disabled (unit tests). wandb is imported lazily."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gem_model.store.paths import gem_home

_SECRET = re.compile(r"(key|token|secret|password|credential|auth)", re.I)


def scrub(obj: Any) -> Any:
    """Drop anything whose key looks like a secret (config never carries credentials to W&B)."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if _SECRET.search(str(k)) else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v) for v in obj]
    return obj


def wandb_mode() -> str:
    """WANDB_MODE, or when unset: online with WANDB_API_KEY, else offline. A value W&B does not know is refused:
    read as unset, a typo of `disabled` would upload a run wherever a key is set."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("disabled", "offline", "online", "dryrun"):
        return "offline" if mode == "dryrun" else mode
    if mode:
        raise ValueError(f"WANDB_MODE={mode!r}: must be disabled, offline, online or dryrun (unset: online with "
                         "WANDB_API_KEY, else offline)")
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class Tracker:
    """One W&B run (or nothing when disabled). `info()` is what goes into Dagster metadata."""

    def __init__(self, *, project: str = "gem", name: str | None = None, group: str | None = None,
                 job_type: str | None = None, config: dict[str, Any] | None = None, run_id: str | None = None,
                 on_log: Callable[[dict[str, Any]], None] | None = None):
        self.mode = wandb_mode()
        self.project, self.group, self.name = project, group, name
        self.on_log = on_log  # also told every `log` (W&B on or off): e.g. Dagster Pipes progress
        self._run: Any = None
        if self.mode == "disabled":
            return
        base = gem_home() / "wandb"  # W&B's folders under GEM_HOME unless the environment says otherwise
        for k, d in {"WANDB_DIR": base, "WANDB_DATA_DIR": base / "data", "WANDB_CACHE_DIR": base / "cache",
                     "WANDB_ARTIFACT_DIR": base / "artifacts"}.items():
            d.mkdir(parents=True, exist_ok=True)
            os.environ.setdefault(k, str(d))
        import wandb  # lazy: importing wandb costs seconds

        # resume="allow": a training run resumed from its checkpoint (same version, same run id) continues its W&B run
        self._run = wandb.init(project=project, id=run_id, name=name, group=group, job_type=job_type,
                               config=scrub(config or {}), mode=self.mode, dir=os.environ["WANDB_DIR"], resume="allow",
                               reinit="finish_previous", settings=wandb.Settings(silent=True, console="off"))

    @property
    def enabled(self) -> bool:
        return self._run is not None

    def info(self) -> dict[str, Any]:
        run = self._run
        return {"mode": self.mode, "project": self.project, "group": self.group,
                "run_id": run.id if run is not None else None,
                "run_dir": str(Path(run.dir).parent) if run is not None else None,
                "url": run.url if run is not None and self.mode == "online" else None}

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self._run is not None:
            self._run.log(data, step=step)
        if self.on_log is not None:
            self.on_log({"run": self.name, "step": step, **data})

    def log_metric_rows(self, rows: list[dict[str, Any]], prefix: str = "eval", step: int | None = None) -> None:
        self.log({f"{prefix}/{r['surface']}/{r['task']}/{k}": r[k] for r in rows
                  for k in ("ne", "auc", "calibration", "oracle_ne", "gap") if r.get(k) is not None}, step=step)

    def summary(self, data: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.summary.update(data)

    def log_artifact(self, path: str | Path, name: str, type: str = "model", metadata: dict[str, Any] | None = None) -> None:
        if self._run is None:
            return
        import wandb

        art = wandb.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", name), type=type, metadata=scrub(metadata or {}))
        path = Path(path)
        if path.is_dir():
            art.add_dir(str(path))
        else:
            art.add_file(str(path))
        self._run.log_artifact(art)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
