"""Typed, validated views of the declarative specs in `assets/`.

Every loader raises `ConfigError` naming the file and the offending field, so a typo in YAML
never surfaces later as a KeyError deep inside an asset.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.functional_validators import AfterValidator

from gem_model.yaml_strict import load_yaml

REPO_ROOT = Path(__file__).resolve().parent.parent


class EnvVar(NamedTuple):
    """default: what env() gives when unset or empty (None: unset, or a call-site default `meaning` states);
    choices: the values env() accepts (empty: any)."""

    name: str
    default: str | None
    meaning: str
    choices: tuple[str, ...] = ()


# Every environment variable the project reads or sets. GEM_* reads go through env(), except kernels/ (it imports
# nothing of the project) and tests/; the others belong to the libraries named.
ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    # where state and specs live
    EnvVar("GEM_HOME", None, "all state the pipelines write; unset: .gem/ in the repo root; made absolute"),
    EnvVar("GEM_ASSETS_DIR", None, "the declarative specs; unset: assets/ in the repo root"),
    EnvVar("GEM_LAKE_URI", None,
           "lake root as an object-store URI (s3://, gs://, az://); unset: $GEM_HOME/lake"),
    EnvVar("GEM_REPORTS_URL", "http://127.0.0.1:3001",
           "where $GEM_HOME/reports is served; metadata links point there"),
    # which world and which model
    EnvVar("GEM_DATA", "sim", "data source: sim (the simulator) or a dataset of assets/sources/<name>/"),
    EnvVar("GEM_SOURCE_DIR", None, "folder of a real dataset's files; unset: the spec's default folder"),
    EnvVar("GEM_SIMULATOR", None,
           "simulator world: unset: assets/simulator.yaml, <name>: assets/simulator_<name>.yaml"),
    EnvVar("GEM_IMPRESSIONS_PER_DAY", None, "overrides the simulator's impressions_per_day (local env)"),
    EnvVar("GEM_MODEL_PRESET", "small", "preset of assets/models/<preset>.yaml and of students.yaml"),
    # where and how it runs
    EnvVar("GEM_ENV", "local", "resource set: local (embedded) or prod (object-store lake, CUDA)", ("local", "prod")),
    EnvVar("GEM_DEVICE", "auto", "training device: auto, cpu, cuda (CUDA_VISIBLE_DEVICES picks the card)",
           ("auto", "cpu", "cuda")),
    EnvVar("GEM_NPROC", "1", "GPUs (torchrun processes) of the foundation step on one node"),
    EnvVar("GEM_EXECUTOR", "default", "Dagster executor: default or k8s (one pod per step)", ("default", "k8s")),
    # kernels/ (read there)
    EnvVar("GEM_KERNEL_BACKEND", "auto", "jagged attention backend: auto, torch or triton"),
    EnvVar("GEM_KERNEL_SHORT_MAX", "128", "longest sequence the Triton short-sequence kernel takes"),
    EnvVar("GEM_KERNEL_SHORT_TILES", "3", "tile configurations (1-3) of the short-sequence kernel"),
    EnvVar("GEM_KERNEL_DETERMINISTIC", "0", "1: deterministic Triton backward (no atomics)"),
    EnvVar("GEM_KERNEL_AUTOTUNE", "1", "0: skip Triton autotuning, take the first config"),
    # tests/ only
    EnvVar("GEM_CHROMIUM", "/usr/bin/chromium", "browser of the UI test"),
    EnvVar("GEM_SHARED_DIR", None, "real-data samples (tests); unset: ../shared beside the clone"),
    # read from other tools' namespaces
    EnvVar("WANDB_MODE", None, "offline, online or disabled; unset: online iff WANDB_API_KEY is set"),
    EnvVar("WANDB_API_KEY", None, "W&B key (secret: never in config or metadata)"),
    EnvVar("WANDB_DIR", None, "W&B run folder; unset: gem_model.train.tracking sets $GEM_HOME/wandb"),
    EnvVar("WANDB_PROJECT", "gem", "W&B project (set by WandbResource)"),
    EnvVar("WANDB_ENTITY", None, "W&B entity (set by WandbResource)"),
    EnvVar("DAGSTER_HOME", None, "the Dagster instance; unset: $GEM_HOME/dagster (make demo / make ui)"),
    EnvVar("DAGSTER_DISABLE_TELEMETRY", "1", "Dagster's usage statistics (the Makefile keeps them off)"),
    EnvVar("WANDB_SILENT", "true", "W&B's console output (the Makefile quiets it)"),
    EnvVar("DAGSTER_PIPES_CONTEXT", None, "set by Dagster Pipes: rank 0 reports to the step"),
    EnvVar("RANK", "0", "torchrun: global rank"),
    EnvVar("WORLD_SIZE", "1", "torchrun: number of processes"),
    EnvVar("LOCAL_RANK", "0", "torchrun: rank on this node (its CUDA device)"),
    EnvVar("LOCAL_WORLD_SIZE", "1", "torchrun: processes on this node (CPU threads are split)"),
    EnvVar("TORCHINDUCTOR_CACHE_DIR", None, "torch.compile cache; unset: $GEM_HOME/torch_compile_cache"),
    EnvVar("TRITON_INTERPRET", "0", "1: run Triton kernels in the CPU interpreter"),
    EnvVar("GX_ANALYTICS_ENABLED", "false", "Great Expectations usage statistics (kept off)"),
    EnvVar("AWS_*", None, "S3 credentials/endpoint, passed to s3:// and s3a:// lakes only"),
    EnvVar("AZURE_*", None, "Azure credentials, passed to az/abfs/abfss/adl lakes only"),
    EnvVar("GOOGLE_*", None, "GCS credentials, passed to gs:// and gcs:// lakes only"),
)}


def env(name: str) -> str | None:
    """The variable's value, or its ENV_VARS default when unset or empty; a name not in ENV_VARS is a KeyError, a
    value outside its choices a ConfigError naming the variable."""
    var = ENV_VARS[name]
    value = os.environ.get(name) or var.default
    if var.choices and value not in var.choices:
        raise ConfigError(f"{name}={value!r}: must be one of {', '.join(var.choices)}")
    return value


ASSETS_DIR = Path(env("GEM_ASSETS_DIR") or REPO_ROOT / "assets")
# GEM_DATA picks the world: `sim` (the simulator) or a public dataset with its own specs in
# assets/sources/<name>/ (surfaces.yaml, calendar.yaml, source.yaml); files it lacks come from assets/.
SOURCES_DIR = ASSETS_DIR / "sources"
SIM = "sim"
NAME_RE = re.compile(r"^[a-z0-9_]+$")


_M = TypeVar("_M", bound="BaseModel")


class ConfigError(ValueError):
    """A spec file in assets/ is invalid; the message names the file and the field."""


def gem_home() -> Path:
    """GEM_HOME, default `.gem/` in the repo root, always absolute."""
    return Path(env("GEM_HOME") or REPO_ROOT / ".gem").expanduser().resolve()


def clock_path() -> Path:
    """$GEM_HOME/clock.json: the days `make next-day` added to the calendar window (gem_model.clock)."""
    return gem_home() / "clock.json"


def extra_days() -> int:
    """Days added to a fixed window since `make demo` (0 before the first `make next-day`)."""
    path = clock_path()
    if not path.exists():
        return 0
    value = json.loads(path.read_text()).get("extra_days", 0)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: extra_days must be a non-negative integer, got {value!r}")
    return value


def validate_name(value: str, what: str = "name", error: type[ValueError] = ValueError) -> str:
    """Names become path components and partition keys: allow only [a-z0-9_]+."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise error(f"{what} {value!r} must match [a-z0-9_]+")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Name = Annotated[str, AfterValidator(validate_name)]  # a path component and partition key: [a-z0-9_]+


class Surface(_Strict):
    name: Name
    domain: Name
    format: Literal["jsonl_nested", "csv_ms", "parquet", "event_stream"]
    traffic_share: float = Field(gt=0, le=1)
    tasks: tuple[Literal["click", "conversion"], ...] = ("click", "conversion")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if "click" not in v:
            raise ValueError("every surface logs clicks: tasks must include 'click'")
        return v


class SurfacesConfig(_Strict):
    surfaces: tuple[Surface, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> SurfacesConfig:
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"surfaces: duplicate surface names in {self.names}")
        total = sum(s.traffic_share for s in self.surfaces)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"traffic_share: shares sum to {total:.6f}, not 1")
        return self

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.surfaces]

    @property
    def domains(self) -> list[str]:
        return sorted({s.domain for s in self.surfaces})

    def get(self, name: str) -> Surface:
        for s in self.surfaces:
            if s.name == name:
                return s
        raise KeyError(f"unknown surface {name!r}; known: {self.names}")

    def in_domain(self, domain: str) -> list[Surface]:
        return [s for s in self.surfaces if s.domain == domain]


class CalendarConfig(_Strict):
    start: dt.date
    days: int | Literal["open"]
    teacher_lag_days: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _check(self) -> CalendarConfig:
        if self.days != "open" and self.days < (need := 4 + self.teacher_lag_days):
            raise ValueError(f"days: a window needs at least {need} days with teacher_lag_days={self.teacher_lag_days}, "
                             f"got {self.days}")
        return self

    def end(self, today: dt.date | None = None) -> dt.date:
        """Last day E of the window (inclusive); 'open' windows end yesterday."""
        if self.days == "open":
            return (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=1)
        return self.start + dt.timedelta(days=self.days - 1)

    def dates(self, today: dt.date | None = None) -> list[dt.date]:
        e = self.end(today)
        return [self.start + dt.timedelta(days=i) for i in range((e - self.start).days + 1)]

    def roles(self, today: dt.date | None = None) -> DayRoles:
        e = self.end(today)
        d = dt.timedelta(days=1)
        return DayRoles(
            warmup=self.start,
            teacher=(self.start + d, e - (2 + self.teacher_lag_days) * d),
            student=(self.start + d, e - 2 * d),
            adapter=e - 2 * d,
            validation=e - d,
            evaluation=e,
        )


class DayRoles(_Strict):
    """Inclusive (first, last) ranges of the window's day roles."""

    warmup: dt.date
    teacher: tuple[dt.date, dt.date]
    student: tuple[dt.date, dt.date]
    adapter: dt.date
    validation: dt.date
    evaluation: dt.date


class DenseFeature(_Strict):
    name: str
    transform: Literal["log1p", "none"] = "none"
    # a column of the dataset's own log (source.yaml `context` says which): `events` carries it as Float64
    context: bool = False


class SparseFeature(_Strict):
    name: Name
    table: Name
    buckets: int = Field(gt=1)
    # closed vocabulary: value i -> row i + 1 (0 = null / unknown), no hashing, no collisions;
    # "surfaces" = the names of surfaces.yaml in order. None: an open vocabulary, hashed.
    vocab: tuple[str, ...] | Literal["surfaces"] | None = None
    # a column of the dataset's own log (source.yaml `context` says which): `events` carries it as text
    context: bool = False


class HistoryColumn(_Strict):
    name: str
    source: Literal["item_id", "action", "surface", "ts"]
    table: str | None = None
    buckets: int | None = None
    vocab: tuple[str, ...] | Literal["surfaces"] | None = None  # as SparseFeature.vocab


class HistoryConfig(_Strict):
    max_len: int = Field(gt=0, le=4096)
    lookback_days: int = Field(ge=0)
    columns: tuple[HistoryColumn, ...]


class CountersConfig(_Strict):
    """Counter features (gem_pipelines/data/counters.py) over the history's lookback window."""

    # pseudo-impressions at the surface's click rate: an id seen n times moves n / (n + prior) of the way
    prior_strength: float = Field(default=5.0, gt=0)
    # 0: the ad's and the user's log-odds on a surface are their own shrunk rates; n: the two offsets of
    # one L2 logistic regression, n backfitting sweeps (a user's popular items no longer count twice)
    joint_passes: int = Field(default=0, ge=0, le=50)
    # each surface's ad and user counters shrink by the empirical-Bayes strength of the same earlier days
    # (gem_pipelines.data.counters.moment_strengths) instead of prior_strength
    moments: bool = False


class FeaturesConfig(_Strict):
    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    history: HistoryConfig
    counters: CountersConfig = CountersConfig()

    def _table_sizes(self) -> list[tuple[str, str, int | None]]:
        """(feature, table, rows) of the sparse features, then of the history columns with a table."""
        return [(f.name, f.table, f.buckets) for f in self.sparse] + [
            (c.name, c.table, c.buckets) for c in self.history.columns if c.table
        ]

    @model_validator(mode="after")
    def _tables_agree(self) -> FeaturesConfig:
        sizes: dict[str, int | None] = {}
        for name, table, buckets in self._table_sizes():
            if table in sizes and sizes[table] != buckets:
                raise ValueError(f"{name}: table {table!r} declared with {buckets} and {sizes[table]} buckets")
            sizes[table] = buckets
        return self

    @model_validator(mode="after")
    def _context_names(self) -> FeaturesConfig:
        # (a name of the unified schema is refused where the columns land: gem_model.store.schemas.context_schema)
        names = [f.name for f in (*self.dense, *self.sparse) if f.context]
        for name in names:
            validate_name(name, "context feature")
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"{twice}: declared as context by a dense and a sparse feature")
        return self

    @cached_property
    def context(self) -> dict[str, Literal["dense", "categorical"]]:
        """The log's own columns the model reads, beyond the unified `events` schema, by kind."""
        return {f.name: "dense" for f in self.dense if f.context} | {f.name: "categorical" for f in self.sparse if f.context}

    @cached_property
    def tables(self) -> dict[str, int]:
        """Embedding table name -> rows, shared between sparse and history features."""
        return {table: buckets for _, table, buckets in self._table_sizes() if buckets}


class SimulatorChurn(_Strict):
    """Share of each kind renewed a day: as many are born (new ids) as retire. 0 = a static world."""

    ads: float = Field(default=0.0, ge=0, le=1)
    organic_items: float = Field(default=0.0, ge=0, le=1)
    users: float = Field(default=0.0, ge=0, le=1)


class SimulatorConfig(_Strict):
    seed: int = 7
    impressions_per_day: int = Field(default=50_000, gt=0)
    n_users: int = Field(default=6000, gt=0)
    n_advertisers: int = Field(default=300, gt=0)
    n_ads: int = Field(default=2000, gt=0)
    n_organic_items: int = Field(default=5000, gt=0)
    n_topics: int = Field(default=24, gt=1)
    organic_per_impression: float = Field(default=1.5, ge=0)
    interest_drift: float = Field(default=0.15, ge=0)
    corruption_rate: float = Field(default=0.003, ge=0, le=0.2)
    # per-surface share of the day's impressions, replacing surfaces.yaml's traffic_share (e.g. the
    # evaluation world gives the small surfaces enough traffic for confidence intervals)
    traffic_share: dict[Name, Annotated[float, Field(gt=0, le=1)]] | None = None
    churn: SimulatorChurn = SimulatorChurn()

    @field_validator("traffic_share")
    @classmethod
    def _shares(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"traffic_share sums to {sum(v.values())}, not 1")
        return v

    def share(self, surface: Surface) -> float:
        """The surface's share of impressions: this config's override, else surfaces.yaml's."""
        if self.traffic_share is None:
            return surface.traffic_share
        if surface.name not in self.traffic_share:
            raise ConfigError(f"simulator traffic_share has no share for surface {surface.name!r}")
        return self.traffic_share[surface.name]


def _read_yaml(path: Path) -> Any:
    try:
        return load_yaml(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: file not found") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e


def _validate(model: type[_M], raw: Any, where: Path | str, what: str = "field") -> _M:
    """`raw` as `model`, or ConfigError naming `where` (the file) and every offending `what` by its dotted path."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{what} '{'.'.join(str(p) for p in err['loc']) or '<root>'}': {err['msg']}" for err in e.errors())
        raise ConfigError(f"{where}: {problems}") from e


def _load(model: type[_M], path: Path, overrides: dict[str, Any] | None = None) -> _M:
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return _validate(model, {**raw, **(overrides or {})}, path)


def dataset_name() -> str:
    """The data source named by GEM_DATA (default `sim`), validated before it becomes a path."""
    name = validate_name(env("GEM_DATA") or SIM, "GEM_DATA", ConfigError)
    if name != SIM and not (SOURCES_DIR / name / "source.yaml").is_file():
        known = sorted(p.name for p in SOURCES_DIR.iterdir() if (p / "source.yaml").is_file()) if SOURCES_DIR.is_dir() else []
        raise ConfigError(f"GEM_DATA={name!r}: no {SOURCES_DIR / name / 'source.yaml'}; known: {[SIM, *known]}")
    return name


def spec_path(filename: str) -> Path:
    """assets/sources/<GEM_DATA>/<filename> when the dataset declares its own, else assets/<filename>."""
    name = dataset_name()
    if name != SIM and (SOURCES_DIR / name / filename).is_file():
        return SOURCES_DIR / name / filename
    if name != SIM and filename == "calendar.yaml":
        # a timed dataset's window comes from its data: its import writes it (gem_pipelines.sources.spec)
        derived = gem_home() / "imports" / name / filename
        if not derived.is_file():
            raise ConfigError(f"{name}: its window comes from its data and it is not imported yet ({derived} is "
                              f"missing): `make demo DATA={name}` imports it first")
        return derived
    return ASSETS_DIR / filename


def load_surfaces(path: Path | None = None) -> SurfacesConfig:
    return _load(SurfacesConfig, path or spec_path("surfaces.yaml"))


def load_calendar(path: Path | None = None, **overrides: Any) -> CalendarConfig:
    """The window of assets/calendar.yaml, extended by the days `make next-day` added (gem_model.clock)."""
    calendar = _load(CalendarConfig, path or spec_path("calendar.yaml"), overrides)
    if path is None and "days" not in overrides and calendar.days != "open":
        if extra := extra_days():
            calendar = calendar.model_copy(update={"days": calendar.days + extra})
    return calendar


def load_features(path: Path | None = None) -> FeaturesConfig:
    return _load(FeaturesConfig, path or spec_path("features.yaml"))


def simulator_path() -> Path:
    """assets/simulator.yaml, or assets/simulator_<GEM_SIMULATOR>.yaml (e.g. `eval`: the world of `make eval`)."""
    name = env("GEM_SIMULATOR")
    if not name:
        return ASSETS_DIR / "simulator.yaml"
    return ASSETS_DIR / f"simulator_{validate_name(name, 'GEM_SIMULATOR', ConfigError)}.yaml"


def load_simulator(path: Path | None = None, **overrides: Any) -> SimulatorConfig:
    return _load(SimulatorConfig, path or simulator_path(), overrides)
