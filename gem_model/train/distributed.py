"""What a multi-process run needs beyond one process: the process group, rank-0 agreement, the torchrun
command line, resume arithmetic across world sizes, and the Dagster Pipes bridge of the launched process.
Under torchrun every rank calls the same library function with the same arguments; rank 0 alone logs,
writes files and talks to Dagster: when Dagster launched the process (DAGSTER_PIPES_CONTEXT set), rank 0
streams progress as log lines and custom messages, then one `{"kind": "result", ...}` message.
`dagster_pipes` (the protocol package, not Dagster) is imported only then: a plain `torchrun` runs without it.
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


@contextlib.contextmanager
def pipes_reporter() -> Iterator[Any]:
    """Dagster Pipes' context on rank 0 when Dagster launched us, else None (the in-process path reads the
    return value; trackers and stdout carry the rest)."""
    if world()[0] != 0 or PIPES_ENV not in os.environ:
        yield None
        return
    from dagster_pipes import open_dagster_pipes  # the protocol package only; lazily, see module doc

    with open_dagster_pipes() as pipes:
        yield pipes


def pipes_progress(pipes: Any) -> ProgressFn:
    """Told every tracker log call: a readable log line for the run's event log + the numbers as a message."""

    def progress(event: dict[str, Any]) -> None:
        shown = {k: v for k, v in event.items() if k.startswith(("train/loss", "valid/mean_ne", "train/samples"))}
        if shown:
            nums = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
            pipes.log.info(f"[{event.get('run')}] step {event.get('step')}: {nums}")
        pipes.report_custom_message({"kind": "progress", **event})

    return progress


def pipes_result(messages: list[Any]) -> dict[str, Any]:
    """The `{"kind": "result"}` payload among the custom messages of a launched run (the asset side)."""
    found = [m for m in messages if isinstance(m, dict) and m.get("kind") == "result"]
    if not found:
        raise RuntimeError("the launched training reported no result through Dagster Pipes (rank 0 failed?)")
    return {k: v for k, v in found[-1].items() if k != "kind"}


def progress_messages(messages: list[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if isinstance(m, dict) and m.get("kind") == "progress"]
