"""An exponential moving average of the model's parameters: what validation scores, best.pt keeps and the run
serves when `train.ema_decay` is set. A day's rows are stored in time order and one pass is a few hundred steps,
so the live weights lean toward the last few thousand rows they saw; the average spans the last ~1/(1-decay)
steps (on the evaluation world's E-1 the live weights swung by up to 0.02 NE between validations).

Not torch.optim.swa_utils.AveragedModel: that deep-copies the module (a compiled or FSDP2-sharded GEM does not
copy cleanly) and keeps the starting weights in the average at weight decay^n; this keeps one shadow tensor per
parameter (local shards under a sharded layout) and corrects the start's bias instead. Not TensorFlow's ramp
min(decay, (1 + n) / (10 + n)) either: it stays below 0.99 for 890 steps, longer than the `small` preset's runs,
so the configured decay would never apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"train.ema_decay must lie in (0, 1), not {decay}")
        self.decay = decay
        # local tensors: under FSDP2 the dense parameters are DTensors, the row-sharded tables plain tensors, and
        # one foreach call cannot mix them; each rank averages its own shards
        with torch.no_grad():
            self.params = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()
                           if p.dtype.is_floating_point]
        self.shadow = [p.detach().clone() for p in self.params]
        self.updates = 0

    def rate(self) -> float:
        """The decay of the next update, bias-corrected as Adam's moments are: the average weighs step i by
        decay^(n - i) over the n steps so far, normalized (the first update copies the weights; the
        horizon grows to ~1/(1 - decay) steps and stays there)."""
        n = self.updates + 1
        return 1.0 - (1.0 - self.decay) / (1.0 - self.decay**n)

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self.shadow, self.params, 1.0 - self.rate())
        self.updates += 1

    @torch.no_grad()
    def reset(self) -> None:
        """The average restarts at the current parameters (after they were loaded from a checkpoint)."""
        torch._foreach_copy_(self.shadow, self.params)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own again after it."""
        with torch.no_grad():
            live = [p.detach().clone() for p in self.params]
            torch._foreach_copy_(self.params, self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, live)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        torch._foreach_copy_(self.params, self.shadow)
