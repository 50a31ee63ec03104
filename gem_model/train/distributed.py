"""What a multi-process run needs beyond one process: the process group, rank-0 agreement, the torchrun
command line, resume arithmetic across world sizes, and the Dagster Pipes bridge of the launched process.

The same library function runs in process (world size 1) and under `torchrun` (world size N): the only
difference is the launcher. Under torchrun every rank calls it with the same arguments; rank 0 alone
logs, writes files and talks to Dagster.

Pipes: when Dagster launched the process (DAGSTER_PIPES_CONTEXT in the environment), rank 0 opens the
Pipes connection and streams progress as log lines and custom messages; the final result is one custom
message `{"kind": "result", ...}`. `dagster_pipes` is the dependency-free protocol package (not
Dagster): it is imported only in that case, so a plain `torchrun` works without it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as torch_dist

PIPES_ENV = "DAGSTER_PIPES_CONTEXT"
ProgressFn = Callable[[dict[str, Any]], None]


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from the process group if any, else torchrun's environment."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank(), torch_dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_process_group(device: str = "auto") -> bool:
    """Under torchrun (WORLD_SIZE > 1): one process group for the whole run (NCCL on CUDA, gloo on CPU).
    Returns True when this call created it (the caller then destroys it)."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or torch_dist.is_initialized():
        return False
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch_dist.init_process_group("nccl" if cuda else "gloo")
    return True


def destroy_process_group() -> None:
    if torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


def broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's value on every rank (e.g. the version name, which embeds a clock and a random id)."""
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return value
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def resume_step(step: int, saved_world: int, world_size: int) -> int:
    """A step consumes one batch per rank: keep the global progress (batches seen) when the world changes."""
    return step * saved_world // world_size


def torchrun_command(module: str, nproc_per_node: int, args: list[str]) -> list[str]:
    """`torchrun --standalone` (single node, rendezvous on a free local port) running `python -m module`."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            "-m", module, *args]


class Reporter:
    """Where progress and the final result go: Dagster Pipes on rank 0 of a Pipes-launched process, else
    nowhere (the in-process path reads the return value; trackers and stdout carry the rest)."""

    def __init__(self, pipes: Any = None):
        self._pipes = pipes

    @property
    def active(self) -> bool:
        return self._pipes is not None

    def progress(self, event: dict[str, Any]) -> None:
        """One tracker log call: a readable log line for the run's event log + the numbers as a message."""
        if self._pipes is None:
            return
        step = event.get("step")
        shown = {k: v for k, v in event.items() if k.startswith(("train/loss", "valid/mean_ne", "train/samples"))}
        if shown:
            nums = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
            self._pipes.log.info(f"[{event.get('run')}] step {step}: {nums}")
        self._pipes.report_custom_message({"kind": "progress", **event})

    def result(self, result: dict[str, Any]) -> None:
        if self._pipes is not None:
            self._pipes.report_custom_message({"kind": "result", **result})


@contextlib.contextmanager
def pipes_reporter() -> Iterator[Reporter]:
    """A Reporter connected to Dagster Pipes on rank 0 when Dagster launched us; a silent one otherwise."""
    rank, _ = world()
    if rank != 0 or PIPES_ENV not in os.environ:
        yield Reporter()
        return
    from dagster_pipes import open_dagster_pipes  # the protocol package only; lazily, see module doc

    with open_dagster_pipes() as pipes:
        yield Reporter(pipes)


def pipes_result(messages: list[Any]) -> dict[str, Any]:
    """The `{"kind": "result"}` payload among the custom messages of a launched run (the asset side)."""
    found = [m for m in messages if isinstance(m, dict) and m.get("kind") == "result"]
    if not found:
        raise RuntimeError("the launched training reported no result through Dagster Pipes (rank 0 failed?)")
    return {k: v for k, v in found[-1].items() if k != "kind"}


def progress_messages(messages: list[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if isinstance(m, dict) and m.get("kind") == "progress"]
