"""RowWiseAdagrad's multi-tensor (foreach) step equals the per-table formula, bit for bit."""

from __future__ import annotations

import torch

from gem_model.train.optim import RowWiseAdagrad


def reference_step(p: torch.Tensor, g: torch.Tensor, acc: torch.Tensor, lr: float, eps: float, wd: float) -> None:
    """The update one table at a time (the optimiser's original loop)."""
    g = g.reshape(p.shape[0], -1).float()
    if wd:
        g = g + wd * p.reshape(p.shape[0], -1).float() * (g != 0).any(dim=1, keepdim=True)
    acc.add_(g.pow(2).mean(dim=1))
    p.add_((g / acc.sqrt().add_(eps)[:, None]).reshape(p.shape).to(p.dtype), alpha=-lr)


def test_foreach_step_matches_the_per_table_formula():
    torch.manual_seed(0)
    shapes = [(50, 8), (30, 4), (20, 16), (7, 1)]
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [p.detach().clone() for p in params]
    accs = [torch.zeros(s[0]) for s in shapes]
    frozen = torch.nn.Parameter(torch.randn(5, 3))  # no gradient: untouched, no state
    opt = RowWiseAdagrad([*params, frozen], lr=0.1, weight_decay=0.01)
    frozen_before = frozen.detach().clone()
    for _ in range(3):
        for p, r, acc in zip(params, ref, accs, strict=True):
            g = torch.randn_like(p)
            g[::3] = 0  # rows absent from the batch
            p.grad = g.clone()
            reference_step(r, g, acc, 0.1, 1e-8, 0.01)
        opt.step()
    for p, r, acc in zip(params, ref, accs, strict=True):
        assert torch.equal(p.detach(), r)
        assert torch.equal(opt.state[p]["sum"], acc)
        assert float(opt.state[p]["step"]) == 3
    assert torch.equal(frozen.detach(), frozen_before) and frozen not in opt.state
