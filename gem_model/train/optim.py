"""Row-wise Adagrad for embedding tables (dense gradients, so DDP/FSDP2 under NCCL just work).

One accumulator per embedding row (the mean of the squared gradient over the row), as in
TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD: memory is rows, not rows x dim. Rows absent from a batch
have a zero gradient and are left untouched (their accumulator does not grow).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 0.05, eps: float = 1e-8,
                 initial_accumulator_value: float = 0.0, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # callers compute the loss themselves: no closure
        """acc += mean(g^2) per row; p -= lr * g / (sqrt(acc) + eps), per row: multi-tensor (foreach) updates,
        a few launches for all tables instead of ~7 per table (every table is a plain tensor, sharded or not)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("RowWiseAdagrad expects dense gradients (nn.Embedding(sparse=False))")
                if not self.state[p]:
                    self.state[p]["step"] = torch.zeros((), dtype=torch.float32)
                    self.state[p]["sum"] = torch.full((p.shape[0],), group["initial_accumulator_value"],
                                                      dtype=torch.float32, device=p.device)
            if not params:
                continue
            states = [self.state[p] for p in params]
            gs = []
            for p in params:
                g = p.grad.reshape(p.shape[0], -1).float()
                if group["weight_decay"]:
                    touched = (g != 0).any(dim=1, keepdim=True)
                    g = g + group["weight_decay"] * p.reshape(p.shape[0], -1).float() * touched
                gs.append(g)
            accs = [st["sum"] for st in states]
            torch._foreach_add_([st["step"] for st in states], 1)
            torch._foreach_add_(accs, [g.pow(2).mean(dim=1) for g in gs])
            denoms = torch._foreach_sqrt(accs)
            torch._foreach_add_(denoms, group["eps"])
            upds = [(g / d[:, None]).reshape(p.shape).to(p.dtype) for g, d, p in zip(gs, denoms, params, strict=True)]
            torch._foreach_add_(params, upds, alpha=-group["lr"])
