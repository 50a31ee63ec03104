"""The example streams of one training run over the lake: the shuffled training stream of this rank, a day
read in order (validation, evaluation), the training window read once in order (the start-up fits)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import torch

from gem_model.config import FeaturesConfig, SurfacesConfig
from gem_model.data.loader import ExampleStream
from gem_model.store.paths import storage_options, table_uri


class RunStreams:
    def __init__(self, data: dict[str, Any], train: dict[str, Any], *, features: FeaturesConfig,
                 surfaces: SurfacesConfig, max_len: int, device: torch.device, seed: int, rank: int, world: int):
        self.data, self.eval_batch_size, self.features = data, int(train["eval_batch_size"]), features
        self.uri = table_uri("training_examples", data["lake"])
        self.storage_options = storage_options()
        self.common = {"features": features, "surfaces_config": surfaces, "uri": self.uri,
                       "storage_options": self.storage_options, "max_len": max_len, "chunk_rows": train["chunk_rows"],
                       "pin_memory": device.type == "cuda", "own_surface": data["own_surface"]}
        self.train = ExampleStream(data["train"][0], data["train"][1], data["surfaces"], batch_size=train["batch_size"],
                                   shuffle=True, shuffle_buffer=train["shuffle_buffer"],
                                   interleave_days=bool(train["interleave_days"]), seed=seed, rank=rank,
                                   world_size=world, **self.common)

    @property
    def days(self) -> list[dt.date]:
        """The training window's days."""
        return list(self.train.dates)

    def day(self, day: str) -> ExampleStream:
        return ExampleStream(day, day, self.data["surfaces"], batch_size=self.eval_batch_size, shuffle=False, **self.common)

    def window(self) -> ExampleStream:
        return ExampleStream(self.data["train"][0], self.data["train"][1], self.data["surfaces"],
                             batch_size=self.eval_batch_size, shuffle=False, **self.common)
