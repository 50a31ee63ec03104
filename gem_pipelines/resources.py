"""Resources, chosen per environment in one place (GEM_ENV=local | prod)."""


import datetime as dt
import os
from pathlib import Path

import dagster as dg

from gem_model.config import SIM, SimulatorConfig, dataset_name, load_simulator, validate_name
from gem_model.config import env as env_value
from gem_model.store.object_store import check_lake_uri
from gem_model.store.paths import gem_home, lake_root, table_uri
from gem_model.train.config import load_preset


class LakeResource(dg.ConfigurableResource):
    """Where the Delta tables live: `root` (a local path or s3://, gs://, az:// URI) or the default. Object-store
    credentials come from the environment (deltalake reads AWS_*, AZURE_*, GOOGLE_*): never in run storage or logs."""

    root: str | None = None

    def uri(self) -> str:
        return check_lake_uri((self.root or lake_root()).rstrip("/"))

    def table(self, name: str) -> str:
        return table_uri(name, self.uri())


class SimulatorResource(dg.ConfigurableResource):
    """The embedded data source. `source: landing` ingests files already dropped in landing/."""

    source: str = "simulator"
    seed: int | None = None
    impressions_per_day: int | None = None
    corruption_rate: float | None = None

    def config(self) -> SimulatorConfig:
        """assets/simulator.yaml with the fields set here on top."""
        return load_simulator(**self.model_dump(include={"seed", "impressions_per_day", "corruption_rate"},
                                                exclude_none=True))

    def landing_root(self) -> Path:
        return gem_home() / "landing"

    def partition_dir(self, surface: str, date: dt.date) -> Path:
        validate_name(surface, "surface")
        return self.landing_root() / surface / date.isoformat()


def resources_for(env: str | None = None) -> dict[str, object]:
    env = env or env_value("GEM_ENV")
    load_preset(str(env_value("GEM_MODEL_PRESET")))  # a wrong GEM_MODEL_PRESET fails the load, not the first training
    if env == "local":
        return {
            "lake": LakeResource(),
            # a public dataset (GEM_DATA) is imported into landing/ first; ingest then reads those files
            "simulator": SimulatorResource(
                source="simulator" if dataset_name() == SIM else "landing",
                impressions_per_day=int(n) if (n := env_value("GEM_IMPRESSIONS_PER_DAY")) else None),
            "accelerator": AcceleratorResource(device=env_value("GEM_DEVICE") or "auto"),
            "wandb": WandbResource(),
            "pipes": dg.PipesSubprocessClient(),
        }
    if env == "prod":
        return {
            "lake": LakeResource(root=dg.EnvVar("GEM_LAKE_URI")),
            "simulator": SimulatorResource(source="landing"),
            "accelerator": AcceleratorResource(device="cuda", nproc_per_node=int(env_value("GEM_NPROC") or 1)),
            "wandb": WandbResource(mode="online"),
            "pipes": dg.PipesSubprocessClient(),
        }
    raise ValueError(f"GEM_ENV must be local or prod, got {env!r}")


class AcceleratorResource(dg.ConfigurableResource):
    """The device every training asset runs on. nproc_per_node > 1 launches torchrun via Dagster Pipes."""

    device: str = "auto"  # auto | cpu | cuda
    nproc_per_node: int = 1
    precision: str = "bf16"  # bf16 autocast on CUDA; CPU always trains in fp32
    # None: the preset's train.compile / train.embedding_sharding (replicated, or row: tables row-wise across
    # the ranks, dense params FSDP2); a value set here overrides every preset
    compile: bool | None = None
    embedding_sharding: str | None = None

    def resolved_device(self) -> str:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"accelerator.device must be auto, cpu or cuda, got {self.device!r}")
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def train_precision(self) -> str:
        """gem_model's train.precision: `precision` (bf16 | fp32) on CUDA; fp32 on the CPU."""
        if self.precision not in ("bf16", "fp32"):
            raise ValueError(f"accelerator.precision must be bf16 or fp32, got {self.precision!r}")
        return self.precision if self.resolved_device() == "cuda" else "fp32"

    def train_overrides(self) -> dict[str, object]:
        """The train settings this resource decides: the precision always, the others where set."""
        chosen = {"compile": self.compile, "embedding_sharding": self.embedding_sharding}
        return {"precision": self.train_precision(), **{k: v for k, v in chosen.items() if v is not None}}


class WandbResource(dg.ConfigurableResource):
    """Our own W&B settings (dagster-wandb breaks on current wandb): offline under $GEM_HOME/wandb by
    default, online when WANDB_API_KEY is in the environment; the key is never part of config."""

    project: str = "gem"
    entity: str | None = None
    mode: str | None = None  # offline | online | disabled; None: online iff WANDB_API_KEY is set

    def apply(self) -> None:
        if self.mode:
            os.environ["WANDB_MODE"] = self.mode
        if self.entity:
            os.environ["WANDB_ENTITY"] = self.entity
        os.environ["WANDB_PROJECT"] = self.project
