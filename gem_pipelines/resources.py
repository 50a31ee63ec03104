"""Resources, chosen per environment in one place (GEM_ENV=local | prod)."""


import datetime as dt
import os
from pathlib import Path

import dagster as dg

from gem_model.config import SimulatorConfig, load_simulator, validate_name
from gem_model.paths import gem_home, lake_root


class LakeResource(dg.ConfigurableResource):
    """Where the Delta tables live: `root` (a local path or s3://, gs://, az:// URI) or the default.

    Object-store credentials are read from the environment by deltalake (AWS_*, AZURE_*, GOOGLE_*),
    never from config, so they never reach run storage or logs.
    """

    root: str | None = None

    def uri(self) -> str:
        return (self.root or lake_root()).rstrip("/")

    def table(self, name: str) -> str:
        validate_name(name, "table")
        return f"{self.uri()}/{name}"


class SimulatorResource(dg.ConfigurableResource):
    """The embedded data source. `source: landing` ingests files already dropped in landing/."""

    source: str = "simulator"
    seed: int | None = None
    impressions_per_day: int | None = None
    corruption_rate: float | None = None

    def config(self) -> SimulatorConfig:
        overrides = {
            k: v
            for k, v in {
                "seed": self.seed,
                "impressions_per_day": self.impressions_per_day,
                "corruption_rate": self.corruption_rate,
            }.items()
            if v is not None
        }
        return load_simulator(**overrides)

    def landing_root(self) -> Path:
        return gem_home() / "landing"

    def partition_dir(self, surface: str, date: dt.date) -> Path:
        validate_name(surface, "surface")
        return self.landing_root() / surface / date.isoformat()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def resources_for(env: str | None = None) -> dict[str, object]:
    env = env or os.environ.get("GEM_ENV", "local")
    if env == "local":
        return {
            "lake": LakeResource(),
            "simulator": SimulatorResource(impressions_per_day=_env_int("GEM_IMPRESSIONS_PER_DAY")),
        }
    if env == "prod":
        return {
            "lake": LakeResource(root=dg.EnvVar("GEM_LAKE_URI")),
            "simulator": SimulatorResource(source="landing"),
        }
    raise ValueError(f"GEM_ENV must be local or prod, got {env!r}")
