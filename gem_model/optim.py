"""Row-wise Adagrad for embedding tables (dense gradients, so DDP/FSDP2 under NCCL just work).

One accumulator per embedding row (the mean of the squared gradient over the row), as in
TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD: memory is rows, not rows x dim. Rows absent from a batch
have a zero gradient and are left untouched (their accumulator does not grow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 0.05, eps: float = 1e-8,
                 initial_accumulator_value: float = 0.0, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("RowWiseAdagrad expects dense gradients (nn.Embedding(sparse=False))")
                g = p.grad.reshape(p.shape[0], -1).float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["sum"] = torch.full((p.shape[0],), group["initial_accumulator_value"],
                                              dtype=torch.float32, device=p.device)
                state["step"] += 1
                if group["weight_decay"]:
                    touched = (g != 0).any(dim=1, keepdim=True)
                    g = g + group["weight_decay"] * p.reshape(p.shape[0], -1).float() * touched
                acc = state["sum"]
                acc.add_(g.pow(2).mean(dim=1))
                upd = g / (acc.sqrt().add_(group["eps"]))[:, None]
                p.add_(upd.reshape(p.shape).to(p.dtype), alpha=-group["lr"])
        return loss
