"""Training on several processes: the process group torchrun describes, each rank's share of a
global batch, and the few collectives the trainer needs.

``torchrun --nproc_per_node=N [--nnodes=M ...] -m marginface train ...`` sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``; :func:`init_from_environment` turns them into a process
group (gloo on CPU, NCCL on CUDA) whose collectives time out after ``timeout_s`` seconds, so a
rank that dies or hangs stops the others with an error instead of a hang.

Every rank walks the same seeded permutation of the training set and takes its slice of each
global batch (:func:`rank_slice`): ``W`` ranks see exactly the batches one process would, so a
run can be resumed at another world size.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "RankFailureError",
    "all_ranks_true",
    "broadcast_object",
    "gather_rows",
    "init_from_environment",
    "is_distributed",
    "rank_slice",
    "torchrun_environment",
]

logger = logging.getLogger(__name__)


class RankFailureError(RuntimeError):
    """A collective failed or timed out: another rank died, hung or raised."""


def torchrun_environment() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from torchrun's variables, or None when absent or
    when the world has one process."""
    try:
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    if world <= 1:
        return None
    return rank, world, int(os.environ.get("LOCAL_RANK", "0"))


def is_distributed() -> bool:
    """Whether a default process group with more than one rank is initialized."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init_from_environment(device_type: str, timeout_s: float) -> bool:
    """Initialize the default process group from torchrun's environment (no-op when already
    initialized or when not launched by torchrun with several processes).

    Args:
        device_type: ``"cuda"`` selects NCCL, anything else gloo.
        timeout_s: seconds after which a collective fails (a dead or hung rank).

    Returns:
        Whether training is distributed.
    """
    if is_distributed():
        return True
    environment = torchrun_environment()
    if environment is None:
        return False
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    logger.info("rank %d of %d (%s)", dist.get_rank(), dist.get_world_size(), backend)
    return True


def rank_slice(index: Tensor, rank: int, world: int) -> Tensor:
    """Rank ``rank``'s share of a global batch ``index[B]``: ``torch.tensor_split`` into
    ``world`` nearly equal, contiguous parts (the first ``B mod world`` get one more)."""
    return index.tensor_split(world)[rank]


def gather_rows(local: Tensor, group: Any = None) -> Tensor:
    """Every rank's rows ``Tensor[n_r, ...]`` concatenated in rank order (sizes may differ)."""
    world = dist.get_world_size(group)
    size = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s) for s in sizes]
    padded = local.new_zeros((max(counts), *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


def all_ranks_true(flag: bool, device: torch.device | str = "cpu") -> bool:
    """Whether ``flag`` holds on every rank (one all-reduce)."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def broadcast_object(value: Any, source: int = 0) -> Any:
    """``value`` of rank ``source`` on every rank (small Python objects this program made)."""
    box = [value]
    dist.broadcast_object_list(box, src=source)
    return box[0]
