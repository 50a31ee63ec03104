"""The resumable state of a distillation loop (a domain model's, a student's): weights, optimizers, torch's RNG and
the loop's own counters, written atomically every `checkpoint_every` steps and loaded back to continue the loop."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gem_model.store import atomic


def save_state(path: Path, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer], **counters: Any) -> None:
    atomic.torch_save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                       "rng": torch.get_rng_state(), **counters}, path)


def load_state(path: Path, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    """`save_state`'s file loaded into `model`, `optimizers` and torch's RNG; returns the loop's counters."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    for opt, saved in zip(optimizers, state["optimizers"], strict=True):
        opt.load_state_dict(saved)
    torch.set_rng_state(state["rng"])
    return state


def fail_if_asked(hp: dict[str, Any], step: int, section: str) -> None:
    """Tests: `fail_at_step` raises right after that step (after its checkpoint, if any)."""
    if hp.get("fail_at_step") and step == int(hp["fail_at_step"]):
        raise RuntimeError(f"simulated failure at step {step} ({section}.fail_at_step)")
