"""Row-wise sharded embedding tables across ranks, dense parameters under FSDP2.

Why: the `large` preset is mostly embedding rows; replicated on every rank (DDP) a table bigger than
one GPU cannot train. Here rank r holds rows [r*c, (r+1)*c) of each table, c = ceil(rows / world)
(the last rank's shard is padded to c rows that are never looked up), so per-rank embedding memory is
1/world of the replicated layout plus at most one padding row per table.

A lookup is the TorchRec row-wise scheme, on plain torch.distributed collectives (TorchRec itself needs
fbgemm-gpu, whose wheels do not load beside torch 2.13):
    ids -> owner rank = id // c -> all-to-all ids to their owners -> owners gather their local rows
        -> all-to-all rows back -> original order.
Autograd runs the same route backwards, so each owner receives the (dense) gradient of its rows from
every rank and sums it; a hook divides by the world size, the mean that FSDP2 takes of the dense
gradients. Embedding gradients stay dense (no sparse tensors: they do not mix with FSDP2 under NCCL),
and `gem_model.train.optim.RowWiseAdagrad` updates the local shard alone: its state is sharded too.

The rest of the model goes under FSDP2 (`fully_shard`, the sharded tables as `ignored_params`).
`full_state_dict` gathers a state dict with the unsharded model's names and shapes (what checkpoints
hold), `load_full_state_dict` scatters one back: checkpoints are world-size independent. Build the
optimisers after `shard_model` and before the first forward (FSDP2 swaps in unsharded parameters
between a forward and its backward).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from gem_model.models.gem import GEM


class RowShardedEmbedding(nn.Module):
    """An `nn.Embedding` whose rows are split across the ranks of the world; same call, same output."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.group = torch_dist.group.WORLD
        self.rank, self.world_size = torch_dist.get_rank(self.group), torch_dist.get_world_size(self.group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.shard_rows = math.ceil(num_embeddings / self.world_size)  # every shard's rows (the last one padded)
        self.start = self.rank * self.shard_rows  # first global row held here
        self.weight = nn.Parameter(torch.zeros(self.shard_rows, embedding_dim, device=device, dtype=dtype))
        self.weight._row_sharded_table = self  # optimiser state of this parameter is per row: gather/scatter rows

    @property
    def local_rows(self) -> int:
        """Real (non-padding) rows held by this rank."""
        return max(0, min(self.num_embeddings - self.start, self.shard_rows))

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's [shard_rows, ...] part of a [num_embeddings, ...] tensor (the weight or a per-row
        optimiser state), padding rows zero."""
        out = full.new_zeros((self.shard_rows, *full.shape[1:]))
        out[: self.local_rows] = full[self.start : self.start + self.local_rows]
        return out

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The whole [num_embeddings, ...] tensor of every rank's shard, on every rank. Collective."""
        parts = [torch.empty_like(shard) for _ in range(self.world_size)]
        torch_dist.all_gather(parts, shard.contiguous(), group=self.group)
        return torch.cat(parts)[: self.num_embeddings]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        owner = torch.div(flat, self.shard_rows, rounding_mode="floor")
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=self.world_size)
        recv = torch.empty_like(send)
        torch_dist.all_to_all_single(recv, send, group=self.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()  # split sizes must be on the host
        wanted = flat.new_empty(sum(recv_splits))
        torch_dist.all_to_all_single(wanted, flat[order].contiguous(), recv_splits, send_splits, group=self.group)
        w = self.weight.view_as(self.weight)
        if w.requires_grad:  # every rank's loss reaches a row's gradient: the mean over ranks, as FSDP2 takes
            w.register_hook(lambda g: g * (1.0 / self.world_size))
        rows = F.embedding(wanted - self.start, w)
        back = funcol.all_to_all_single_autograd(rows, send_splits, recv_splits, self.group)
        back = funcol.wait_tensor(back) if isinstance(back, funcol.AsyncCollectiveTensor) else back
        out = back.new_empty(back.shape).index_copy(0, order, back)  # undo the sort by owner
        return out.reshape(*ids.shape, self.embedding_dim)


def shard_embeddings(model: GEM, device: torch.device | str | None = None) -> list[RowShardedEmbedding]:
    """Replace the embedding tables of `model` by their row-wise sharded versions (this rank's rows, the
    unsharded model's init, on `device`), in place; returns them. Tables = the `nn.Embedding`s whose weight
    `model.embedding_parameters()` lists (the row-wise optimised ones; small lookup tables such as the
    time-gap encoding stay dense, under FSDP2)."""
    wanted = {id(p) for p in model.embedding_parameters()}
    sharded: list[RowShardedEmbedding] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Embedding) and id(child.weight) in wanted:
                if child.sparse or child.padding_idx is not None or child.max_norm is not None:
                    raise ValueError(f"{name}: only plain dense-gradient embeddings can be sharded row-wise")
                new = RowShardedEmbedding(child.num_embeddings, child.embedding_dim,
                                          device=device or child.weight.device, dtype=child.weight.dtype)
                with torch.no_grad():
                    new.weight.copy_(new.shard(child.weight))
                setattr(parent, name, new)
                sharded.append(new)
    return sharded


def shard_model(model: GEM, device: torch.device | str | None = None) -> GEM:
    """Embedding tables row-wise across ranks, every other parameter under FSDP2 (in place): one unit per
    trunk block (`model.blocks`) and the root for the rest. `device`: where this rank's part goes (the
    model may arrive on the CPU, so that no device ever holds a whole table); FSDP2 moves the dense part
    to its mesh's device.

    FSDP2 cannot shard 0-d parameters (e.g. a learned temperature): those stay replicated and
    `sync_replicated_grads` averages their gradients (call it after every backward)."""
    tables = shard_embeddings(model, device=device)
    scalars = [p for p in model.parameters() if p.dim() == 0]
    if device is not None:  # what FSDP2 leaves alone: the replicated scalars and the unmanaged buffers
        for p in scalars:
            p.data = p.data.to(device)
    model._replicated_params = scalars  # type: ignore[assignment]
    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    mesh = DeviceMesh.from_group(torch_dist.group.WORLD, kind)  # FSDP2 shards over these ranks, on `kind`
    ignored = {t.weight for t in tables} | set(scalars)
    for block in model.blocks:  # one FSDP2 unit per trunk block: one gathered at a time
        fully_shard(block, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    register_fsdp_forward_method(model, "forward_with_summary")  # predict() calls it instead of forward
    return model


def sync_replicated_grads(model: nn.Module) -> None:
    """Mean over ranks of the gradients of the replicated (non-FSDP2, non-sharded) parameters."""
    for p in getattr(model, "_replicated_params", []):
        if p.grad is not None:
            torch_dist.all_reduce(p.grad)
            p.grad /= torch_dist.get_world_size()


def embedding_bytes(model: GEM) -> int:
    """Bytes of embedding-table rows this rank holds (a sharded table counts its local shard, padding
    included); tables as in `shard_embeddings`."""
    wanted = {id(p) for p in model.embedding_parameters()}
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if isinstance(m, RowShardedEmbedding | nn.Embedding) and id(m.weight) in wanted)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's state dict (names and shapes), gathered on every rank. Collective."""
    tables = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, RowShardedEmbedding)}
    return {k: tables[k].gather(v) if k in tables else v.full_tensor() if isinstance(v, DTensor) else v.detach().clone()
            for k, v in model.state_dict().items()}


def load_full_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Load an unsharded state dict (e.g. a checkpoint of any world size) into a sharded model."""
    tables = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, RowShardedEmbedding)}
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if k in tables:
                v.copy_(tables[k].shard(state[k]))
            elif isinstance(v, DTensor):
                v.copy_(distribute_tensor(state[k].to(v.dtype), v.device_mesh, v.placements))
            else:
                v.copy_(state[k])


# ------------------------------------------------------------------------------------------------
# Training layouts: what the train loop asks of the parallelism, so that one loop serves both.


class ReplicatedLayout:
    """World size 1 or DDP: every rank holds the whole model; rank 0's state is the full state."""

    collective = False  # state calls need no other rank

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def load_model_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        model.load_state_dict(state)

    def optim_state(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        return opt.state_dict()

    def load_optim_state(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        opt.load_state_dict(state)

    def after_backward(self, model: nn.Module) -> None:
        pass

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


class RowShardedLayout(ReplicatedLayout):
    """Embedding rows sharded across ranks, dense parameters under FSDP2. State calls are collective
    (every rank takes part) and return the unsharded layout, so checkpoints load under any world size
    and into an unsharded model."""

    collective = True

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return full_state_dict(model)

    def load_model_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        load_full_state_dict(model, state)

    def optim_state(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        sd = opt.state_dict()
        params = [p for g in opt.param_groups for p in g["params"]]
        return {**sd, "state": {i: {k: _full_state_tensor(v, params[i]) for k, v in s.items()} for i, s in sd["state"].items()}}

    def load_optim_state(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        params = [p for g in opt.param_groups for p in g["params"]]
        local = {i: {k: _local_state_tensor(v, params[int(i)]) for k, v in s.items()} for i, s in state["state"].items()}
        opt.load_state_dict({**state, "state": local})

    def after_backward(self, model: nn.Module) -> None:
        sync_replicated_grads(model)

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """The norm over FSDP2 shards (DTensor) and replicated parameters together, then one scale."""
        with_grad = [p for p in params if p.grad is not None]
        sharded = [p for p in with_grad if isinstance(p.grad, DTensor)]
        plain = [p for p in with_grad if not isinstance(p.grad, DTensor)]
        norms = [torch.nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor()] if sharded else []
        norms += [torch.nn.utils.get_total_norm([p.grad for p in plain])] if plain else []
        total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
        for group in (sharded, plain):
            if group:  # takes the parameters, scales their .grad
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total


def _full_state_tensor(v: Any, p: nn.Parameter) -> Any:
    if isinstance(v, DTensor):
        return v.full_tensor()
    table: RowShardedEmbedding | None = getattr(p, "_row_sharded_table", None)
    if table is not None and isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == table.shard_rows:
        return table.gather(v)  # per-row state
    return v


def _local_state_tensor(v: Any, p: nn.Parameter) -> Any:
    if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape:
        return distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
    table: RowShardedEmbedding | None = getattr(p, "_row_sharded_table", None)
    if table is not None and isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == table.num_embeddings:
        return table.shard(v)
    return v
