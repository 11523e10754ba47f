"""Training on several processes: the process group torchrun describes, each rank's share of a
global batch, the device a run asks for (:func:`resolve_device`), and the few collectives the
trainer needs.

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
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "Placement",
    "RankFailureError",
    "all_ranks_true",
    "broadcast_object",
    "clip_gradient_norm",
    "collective_failure",
    "init_from_environment",
    "is_distributed",
    "join_process_group",
    "leave_process_group",
    "rank_slice",
    "resolve_device",
    "torchrun_environment",
]

logger = logging.getLogger(__name__)


class RankFailureError(RuntimeError):
    """A collective failed or timed out: another rank died, hung or raised."""


def collective_failure(
    error: BaseException, *, rank: int, timeout_s: float, way_forward: str
) -> RankFailureError:
    """The one-line :class:`RankFailureError` for ``error`` raised by a collective on ``rank``:
    another rank died, raised, or hung past ``timeout_s`` seconds; ``way_forward`` says what
    is kept on disk and how to go on."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else repr(error)
    return RankFailureError(
        f"rank {rank}: a collective failed (another rank died, raised, or hung past "
        f"--dist-timeout = {timeout_s:g} s): {first}; {way_forward}"
    )


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
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _attempt_store(environment[1], timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        rank, world = environment[0], environment[1]
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    _GROUPS_FROM_ENVIRONMENT.append(dist.group.WORLD)
    logger.info("rank %d of %d (%s)", dist.get_rank(), dist.get_world_size(), backend)
    return True


class Placement(NamedTuple):
    """Where one training process runs (:func:`join_process_group`)."""

    device: torch.device
    distributed: bool
    rank: int
    world: int


def join_process_group(device: torch.device, timeout_s: float) -> Placement:
    """Join torchrun's process group when launched by torchrun (:func:`init_from_environment`;
    collectives time out after ``timeout_s`` seconds) and say where this process trains.

    Returns:
        ``(device, distributed, rank, world)``: in a process group its rank and world size,
        and on CUDA the rank's own GPU (``cuda:LOCAL_RANK``); else ``(device, False, 0, 1)``.
    """
    if not init_from_environment(device.type, timeout_s):
        return Placement(device, False, 0, 1)
    environment = torchrun_environment()
    if device.type == "cuda" and environment is not None:
        device = torch.device("cuda", environment[2])
    return Placement(device, True, dist.get_rank(), dist.get_world_size())


_GROUPS_FROM_ENVIRONMENT: list[Any] = []
"""The default process group, once :func:`init_from_environment` has created it (and until
:func:`leave_process_group`): a group the caller created is the caller's to destroy."""


def leave_process_group() -> bool:
    """Destroy the default process group if :func:`init_from_environment` created it.

    The command line calls it when a command has finished (or stopped on a signal after its
    checkpoint): a process that exits with its gloo group alive may abort (SIGABRT) while the
    interpreter shuts down, turning a finished run's exit status 0 into a failure that torchrun
    would restart. Not called after a failed collective, whose peers may be gone. A group the
    caller initialized is left alone.

    Returns:
        Whether a group was destroyed.
    """
    if not _GROUPS_FROM_ENVIRONMENT:
        return False
    group = _GROUPS_FROM_ENVIRONMENT.pop()
    if not (dist.is_available() and dist.is_initialized()) or dist.group.WORLD is not group:
        return False
    dist.destroy_process_group()
    return True


def _attempt_store(world: int, timeout: datetime.timedelta) -> Any:
    """The process group's store for this torchrun attempt, or None (``env://`` as usual).

    With the c10d rendezvous, torchrun shares its own TCPStore with the workers
    (``TORCHELASTIC_USE_AGENT_STORE``) and keeps it across restarts, so the keys the process
    group of the failed attempt wrote (each rank's gloo address, NCCL's unique id) are still
    there when the restarted group forms; a new rank can read an old one and connect to a
    process that no longer exists. Every attempt gets its own key prefix
    (``TORCHELASTIC_RESTART_COUNT``)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"marginface/attempt-{attempt}/", shared)


def rank_slice(index: Tensor, rank: int, world: int) -> Tensor:
    """Rank ``rank``'s share of a global batch ``index[B]``: ``torch.tensor_split`` into
    ``world`` nearly equal, contiguous parts (the first ``B mod world`` get one more)."""
    return index.tensor_split(world)[rank]


def clip_gradient_norm(
    parameters: list[torch.nn.Parameter],
    max_norm: float,
    *,
    sharded: torch.nn.Parameter | Sequence[torch.nn.Parameter] | None,
) -> None:
    """Clip the global gradient norm ``‖g‖₂`` of ``parameters`` to ``max_norm`` (scale every
    gradient by ``max_norm / (‖g‖ + 1e-6)`` when that is below 1), on every rank alike.

    ``sharded``: the parameters whose entries are split over the ranks (a sharded head's class
    centers and its per-class parameters, :func:`~marginface.head.state.per_class_parameters`):
    their squared norms are summed over ranks (one all-reduce); the others are replicated (DDP
    averaged their gradients), so each counts once. Without a process group this is
    ``torch.nn.utils.clip_grad_norm_``.
    """
    params = [p for p in parameters if p.grad is not None]
    if not is_distributed():
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    if isinstance(sharded, torch.nn.Parameter):
        sharded = [sharded]
    split = {id(p) for p in sharded or ()}
    device = params[0].grad.device if params else torch.device("cpu")
    squares = torch.zeros(2, dtype=torch.float64, device=device)  # (replicated, sharded)
    for p in params:
        squares[1 if id(p) in split else 0] += p.grad.detach().double().pow(2).sum()
    sharded_total = squares[1:].clone()
    dist.all_reduce(sharded_total)
    norm = float((squares[0] + sharded_total[0]).sqrt())
    factor = max_norm / (norm + 1e-6)
    if factor < 1:
        for p in params:
            p.grad.detach().mul_(factor)


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


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; anything else is passed to ``torch.device``
    (``ValueError`` if it names CUDA and none is present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device
