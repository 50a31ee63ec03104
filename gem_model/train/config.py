"""The training run's config, typed: a preset of assets/models/ (with the GEM_DATA dataset's adjustments on
top) and a run's overrides, checked key by key. An unknown key raises ConfigError naming it, and the file
when it comes from one; `resolve_config` gives the complete plain dict that config.json and checkpoints carry.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator

from gem_model.config import (
    ASSETS_DIR,
    SOURCES_DIR,
    ConfigError,
    _read_yaml,
    _Strict,
    _validate,
    dataset_name,
    validate_name,
)
from gem_model.models.calibration import DEFAULT_CALIBRATION
from gem_model.models.config import model_keys
from gem_model.train.item_svd import MAX_ROWS


class WidePrior(_Strict):
    """Per-id wide offsets of `features` from an L2 logistic regression (gem_model.train.wide_prior)."""

    features: list[str]
    l2: float
    passes: int = 1


class DensePrior(_Strict):
    """Heads' bias and dense wide weights from an L2 logistic regression (gem_model.train.wide_prior)."""

    features: list[str]
    l2: float = 1.0
    pool_l2: float | None = Field(default=None, gt=0)  # the heads of a task shrink toward shared weights


class ItemSvd(_Strict):
    """The item table from the window's PPMI-SVD, the `max_rows` rows met most (gem_model.train.item_svd)."""

    dim: int
    max_rows: int = MAX_ROWS
    # a day scored after the window folds in the ids born since (gem_model.distill.serving_fold_in),
    # in slices of the day, each with the day's earlier hours too (a divisor of 24; 1: none of the day)
    serve_fold_in: bool = True
    serve_slices: int = Field(default=4, ge=1, le=24)
    # the fold's co-occurrence reads at least this many whole days before the day scored, days of the window
    # included (None: only the days after the window); off: it placed new ads worse (bench/MODEL_SEARCH.md 38)
    fold_lookback_days: int | None = Field(default=None, ge=1)
    # the map's fitting days each folded in with as many whole days before them as the day served (its window's
    # included where it reaches back that far), so the map is fitted on predictions made as the day's are (section 39)
    fit_fold_like_served: bool = False
    # after the surface's map, each fold status's own: platt (slope and shift) or shift (the slope kept)
    status_map: Literal["platt", "shift"] = "platt"
    # then each surface shifted back to its click rate on the same rows (the status maps are pooled over surfaces)
    relevel_surfaces: bool = True

    @field_validator("serve_slices")
    @classmethod
    def _divides_a_day(cls, k: int) -> int:
        if 24 % k:
            raise ValueError(f"serve_slices must divide 24, not {k}")
        return k


class TrainConfig(_Strict):
    batch_size: int = 1024
    eval_batch_size: int = 4096
    lr: float = 0.004
    emb_lr: float = 0.05
    emb_weight_decay: float = 0.0  # row-wise Adagrad: L2 on the rows a batch touches
    wide_weight_decay: float | None = None  # L2 on the per-id wide offsets (None: emb_weight_decay)
    wide_lr: float | None = None  # row-wise Adagrad rate of the per-id wide offsets (None: emb_lr)
    weight_decay: float = 0.0
    epochs: int = 1
    max_steps: int | None = None
    warmup_steps: int = 20
    min_lr_frac: float = 0.1
    # a warm start (init_from) runs the schedule at these times the rates: its optimizers start empty, and
    # a fresh Adam / Adagrad moves every weight of a trained model by about the full rate at first. 0.1:
    # where a cold schedule ends (min_lr_frac); on the demo world's day-1 retrain the full rate took E-1
    # from 0.982 to 1.058 in 39 steps, 0.1 reached 0.981 (bench/RESULTS.md)
    warm_lr_frac: float = Field(default=0.1, gt=0, le=1)
    # the days a warm start trains on: "new", only the window's days after the loaded checkpoint's own window,
    # as continued training does (the whole window where none is new or the checkpoint records none);
    # "window", the whole window again. The evaluation world's weekly retrain (one new day, 3 seeds): E-1
    # 0.9625 against 0.9628 (better at 2 seeds of 3), in 60% of the time; at the full rate 0.9632 (bench/RESULTS.md)
    warm_days: Literal["window", "new"] = "new"
    # the daily refresh (foundation_refresh, gem_model.train.refresh): a foundation continued each day on the day
    # that entered its window, for this many epochs at the warm-start rates; None: no refresh, the weekly retrain
    # alone (bench/RESULTS.md, "A daily refresh chained over the week of `dfab6bc`")
    refresh_epochs: int | None = Field(default=None, ge=1)
    grad_clip: float = 1.0  # 0: no clipping
    # validate, keep and serve an exponential moving average of the weights (gem_model.train.ema); None: the live ones
    ema_decay: float | None = Field(default=None, gt=0, lt=1)
    checkpoint_every: int = 100
    log_every: int = 20
    eval_every: int | None = None  # validate every N steps (None or 0: after each epoch)
    patience: int = 1
    shuffle_buffer: int = 65536
    chunk_rows: int = 16384
    interleave_days: bool = False  # the training stream takes one chunk of each day in turn (gem_model.data.loader)
    compile: bool = False
    # replicated, or row: tables row-wise across ranks, dense params FSDP2 (gem_model.train.sharding)
    embedding_sharding: Literal["replicated", "row"] = "replicated"
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere
    torch_threads: int | None = None
    # start-up fits on the training window before the first step (gem_model.train.startup); None: off
    wide_prior: WidePrior | None = None
    item_svd: ItemSvd | None = None
    dense_prior: DensePrior | None = None
    head_bias: Literal["fixed", "base_rate"] = "fixed"  # base_rate: logit of each head's training-window rate
    fail_at_step: int | None = None  # tests: raise after this step (after its checkpoint, if any)
    # tests: sigkill dies as the OOM killer kills, no exception; sigkill_group takes the whole process group with it
    # (under a daemon: the run's worker, its code server and the daemon, as a machine restart)
    fail_with: Literal["raise", "sigkill", "sigkill_group"] = "raise"
    dump_rank_weights: bool = False  # tests: write rank<r>.pt with each rank's final weights
    calibrate: bool = DEFAULT_CALIBRATION["enabled"]  # Platt map per (surface, task) fitted after selection
    calibration_min_positives: int = DEFAULT_CALIBRATION["min_positives"]  # fewer: the pooled map alone
    # a surface's own map weighs positives / (positives + this) against the pooled one (gem_model.models.calibration)
    calibration_shrink_positives: float = DEFAULT_CALIBRATION["shrink_positives"]
    # the shift toward a surface's own click rate weighs positives / (positives + this); None: no shift
    calibration_level_positives: float | None = Field(default=DEFAULT_CALIBRATION["level_positives"], ge=0)


def _iso(d: Any) -> str | None:
    return None if d is None else (d.isoformat() if isinstance(d, dt.date) else str(d))


Day = Annotated[str | None, BeforeValidator(_iso)]  # a date or its ISO string, kept as the string


class DataConfig(_Strict):
    train: list[str]  # [first_date, last_date], inclusive (one date: that day)
    valid: Day = None  # model selection / early stopping
    eval: Day = None  # final metrics, with the oracle when present
    surfaces: Annotated[list[str] | None, BeforeValidator(lambda v: list(v) if v else None)] = None  # None: all of surfaces.yaml
    own_surface: bool = False  # one surface read as a model of it alone sees it (gem_model.data.own_surface)
    lake: str | None = None  # lake root (default GEM_LAKE_URI or $GEM_HOME/lake)
    oracle: bool = True

    @field_validator("train", mode="before")
    @classmethod
    def _range(cls, v: Any) -> list[str | None]:
        v = [v, v] if isinstance(v, str | dt.date) else list(v)
        if len(v) != 2:
            raise ValueError("data.train is [first_date, last_date] or one date")
        return [_iso(d) for d in v]


class TrackingConfig(_Strict):
    project: str = "gem"
    group: str | None = None
    name: str | None = None
    job_type: str = "train"


def _model_keys(dims: dict[str, Any]) -> dict[str, Any]:
    if unknown := sorted(set(dims) - model_keys()):
        raise ValueError(f"unknown model key(s) {unknown}")
    return dims


ModelDims = Annotated[dict[str, Any], AfterValidator(_model_keys)]  # GEMConfig's dimensions, checked by name


class RunConfig(_Strict):
    preset: str = "tiny"  # assets/models/<preset>.yaml, or a path to such a file
    model: ModelDims = {}
    train: TrainConfig = TrainConfig()
    data: DataConfig
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    out_dir: str | None = None  # checkpoint.pt, best.pt, model.pt, metrics.json, config.json (gem_model.train.loop)
    tracking: TrackingConfig = TrackingConfig()


class _PresetFile(_Strict):  # one layer of a preset: checked whole, merged key by key
    model: ModelDims | None = None
    train: TrainConfig | None = None


def load_preset(preset: str | Path) -> dict[str, Any]:
    """assets/models/<name>.yaml (or a file given as a Path) -> {"model": {...}, "train": {...}}. A named
    preset also takes the GEM_DATA dataset's adjustments, assets/sources/<dataset>/models/<name>.yaml, on
    top (a real dataset's click rate and size are not the simulator's). Every file's keys are checked."""
    if isinstance(preset, Path):
        path, layers = preset, [preset]
    else:  # a string is a name (GEM_MODEL_PRESET, a run's `preset`), never a path
        name = validate_name(preset, "preset", ConfigError)
        path = ASSETS_DIR / "models" / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob("*.yaml") if p.stem != "students")  # students.yaml: theirs
            raise ConfigError(f"preset {name!r} (GEM_MODEL_PRESET or a run's preset): no {path}; known: {known}")
        layers = [path, SOURCES_DIR / dataset_name() / "models" / f"{name}.yaml"]
    out: dict[str, Any] = {"model": {}, "train": {}}
    for p in layers:
        raw = (_read_yaml(p) or {}) if p == path or p.is_file() else {}
        _validate(_PresetFile, raw, str(p), "key")
        for k in out:
            out[k].update(raw.get(k) or {})
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A run config (JSON or YAML), its keys checked here so that an error names the file."""
    raw = json.loads(Path(path).read_text()) if str(path).endswith(".json") else _read_yaml(Path(path))
    _validate(RunConfig, raw, str(path), "key")
    return raw


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """Preset + overrides -> the complete plain dict (what config.json and checkpoints carry)."""
    if "train" not in (config.get("data") or {}):
        raise ValueError("config.data.train = [first_date, last_date] is required")
    preset = config.get("preset", "tiny")
    layers = load_preset(preset) if preset else {}
    run = {**config, "preset": str(preset),
           "model": {**layers.get("model", {}), **(config.get("model") or {})},
           "train": {**layers.get("train", {}), **(config.get("train") or {})}}
    return _validate(RunConfig, run, "run config", "key").model_dump()
