"""The optimizer state of a head's per-class parameters (the class centers ``[C·K, D]``,
AdaM-Softmax's learnable margins ``[C]``, :mod:`marginface.class_parameters`) in checkpoints.

On a class-sharded head each rank holds its block of every per-class parameter, and so its
block of their optimizer state (SGD's momentum buffer, Adam's and AdamW's two moments); the
scalar entries (Adam's ``step``) are replicated. A checkpoint keeps each such state in the
layout of its parameter (:func:`~marginface.head.state.class_state_view`: a DTensor of global
shape ``[C, K·D]`` or ``[C]`` sharded on dim 0), so ``torch.distributed.checkpoint`` reshards it
to any number of ranks as it does the parameters; a one-process ``checkpoint.pt`` holds the
full ``[C·K, D]`` and ``[C]`` tensors, cut to each rank's block on restore
(:func:`local_optimizer_state`). docs/distributed.md describes the layout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...head.state import class_state_view, per_class_parameters

__all__ = ["class_state_positions", "class_state_targets", "local_optimizer_state"]


def class_state_positions(optimizer: torch.optim.Optimizer, head: nn.Module) -> dict[int, str]:
    """The positions among ``optimizer``'s parameters (the keys of
    ``optimizer.state_dict()["state"]``) of the head's per-class parameters, each mapped to its
    ``state_dict`` name (:func:`~marginface.head.state.per_class_parameters`: ``"weight"``,
    ``"class_parameters.margin"``, ...); those not optimized are absent."""
    names = {id(parameter): name for name, parameter in per_class_parameters(head).items()}
    positions = {}
    position = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if id(parameter) in names:
                positions[position] = names[id(parameter)]
            position += 1
    return positions


def class_state_targets(
    entries: dict[str, tuple[torch.Size, torch.dtype]],
    targets: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    head: nn.Module,
) -> tuple[dict[str, Tensor], dict[int, str]]:
    """Add to ``targets`` the optimizer state of the head's per-class parameters (the centers,
    AdaM-Softmax's margins) in the layout it was saved in (sharded by class,
    :func:`~marginface.head.state.class_state_view`), each backed by a tensor shaped like
    this rank's block of the parameter.

    Args:
        entries: the checkpoint's tensors, key → (global shape, dtype).
        targets: the load targets, ``loss/<name>`` among them (their global shapes).

    Returns:
        ``(holders, stale)``: the tensors the optimizer takes, by checkpoint key; and the
        positions (→ name) of per-class parameters whose state was saved as a block of one rank
        (a checkpoint written before that state was sharded), which cannot be resharded.
    """
    per_class = per_class_parameters(head)
    holders: dict[str, Tensor] = {}
    stale: dict[int, str] = {}
    for position, name in class_state_positions(optimizer, head).items():
        prefix = f"optimizer/{position}/"
        shape = tuple(targets[f"loss/{name}"].shape)  # global: [C, K·D] or [C]
        for key, (size, dtype) in entries.items():
            if not key.startswith(prefix):
                continue
            if tuple(size) == shape:
                holders[key] = torch.empty_like(per_class[name], dtype=dtype)  # this rank's
                targets[key] = class_state_view(holders[key], head, name)
            elif name != "weight" and len(size) == 1:
                stale[position] = name
    return holders, stale


def local_optimizer_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, head: nn.Module
) -> dict[str, Any]:
    """An optimizer state dict saved by one process, with the state of the head's per-class
    parameters cut to this rank's classes when ``head`` is sharded: the centers'
    ``[C·K, D]`` to ``[c·K, D]``, each per-class parameter's ``[C]`` to ``[c]``."""
    shard = getattr(head, "shard", None)
    if shard is None:
        return state
    k = head.sub_centers
    cut = dict(state["state"])
    for index, name in class_state_positions(optimizer, head).items():
        if index not in cut:
            continue
        rows = k if name == "weight" else 1  # entries per class
        entries = dict(cut[index])
        for key, value in entries.items():
            per_class = isinstance(value, Tensor) and value.dim() >= 1
            if per_class and value.shape[0] == head.num_classes * rows:
                entries[key] = value[shard.start * rows : shard.stop * rows].clone()
        cut[index] = entries
    return {**state, "state": cut}
