"""Learnable per-class parameters: what a head does with a margin's
:meth:`~marginface.margins.base.Margin.class_parameters` declaration (AdaM-Softmax's margins).

A margin declares, by name, a value per class (:class:`~marginface.margins.base.ClassParameter`);
the head (:class:`~marginface.head.MarginSoftmaxLoss`) holds each as a ``Parameter[c]`` for the
``c`` classes of its weight (all ``C``, or its block on a class-sharded head) and, at each step:

* gathers every row's target-class value (:func:`target_class_values`; Partial FC reads the
  sampled classes' values, as it reads their centers), which the executors hand to the margin in
  its context, as ``N``-vectors with gradient (no ``N×C`` term on any executor);
* adds the margin's :meth:`~marginface.margins.base.Margin.class_regularizer` of each
  parameter's sum over all classes (:func:`class_regularizer`: on a sharded head each rank sums
  its block and the value is all-reduced, so the gradient reaches each rank's own classes).

A sharded head's ``state_dict`` holds each parameter as a DTensor of global shape ``[C]``
(:func:`class_vector_dtensor`), and ``load_state_dict`` cuts a full ``[C]`` vector to the
rank's block (:func:`cut_class_vector`), as for the weight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .executors.sharding import ClassShard
from .margins.base import Margin

__all__ = [
    "class_parameters_as_dtensors",
    "class_regularizer",
    "class_vector_dtensor",
    "create_class_parameters",
    "cut_class_parameters",
    "cut_class_vector",
    "reset_class_parameters",
    "target_class_values",
]


def create_class_parameters(
    margin: Margin, count: int, *, device: Any = None, dtype: torch.dtype | None = None
) -> nn.ParameterDict:
    """One uninitialized ``Parameter[count]`` per per-class parameter ``margin`` declares
    (an empty dict for the other margins); :func:`reset_class_parameters` draws them."""
    return nn.ParameterDict(
        {
            name: nn.Parameter(torch.empty(count, device=device, dtype=dtype))
            for name in margin.class_parameters()
        }
    )


def reset_class_parameters(parameters: nn.ParameterDict, margin: Margin) -> None:
    """Draw each parameter from its declared ``U(init_low, init_high)``."""
    declared = margin.class_parameters()
    for name, parameter in parameters.items():
        nn.init.uniform_(parameter, declared[name].init_low, declared[name].init_high)


def target_class_values(
    parameters: nn.ParameterDict, margin: Margin, targets: Tensor, sampled: Tensor | None
) -> dict[str, Tensor] | None:
    """Each parameter at each row's target class, bounded as the margin sees it
    (:meth:`~marginface.margins.base.ClassParameter.bounded`): ``{name: Tensor[N]}``, 0 where
    ``targets`` is -1 (another rank owns the class); None when the margin declares none.

    Args:
        parameters: the head's ``Parameter[c]`` of each declared name.
        margin: the margin that declares them.
        targets: ``int64[N]``, local classes, or positions in ``sampled``; -1 for none.
        sampled: Partial FC's sorted local classes ``int64[S]``, or None.
    """
    if not parameters:
        return None
    declared = margin.class_parameters()
    owned = targets >= 0  # (N,)
    safe = targets.clamp_min(0)
    local = safe if sampled is None else sampled[safe.to(sampled.device)]  # (N,)
    values = {}
    for name, parameter in parameters.items():
        rows = declared[name].bounded(parameter[local.to(parameter.device)])  # (N,)
        values[name] = torch.where(owned.to(rows.device), rows, torch.zeros_like(rows))
    return values


def class_regularizer(
    parameters: nn.ParameterDict, margin: Margin, num_classes: int, shard: ClassShard | None
) -> Tensor | None:
    """The margin's :meth:`~marginface.margins.base.Margin.class_regularizer` (0-dim) of each
    bounded parameter's sum over all ``num_classes`` classes, or None. With a ``shard``: this
    rank's sum, its value all-reduced (the gradient reaches this rank's own classes only)."""
    if not parameters:
        return None
    declared = margin.class_parameters()
    sums = {}
    for name, parameter in parameters.items():
        total = declared[name].bounded(parameter).sum()  # (), this rank's classes
        if shard is not None:
            everyone = shard.all_sum_(total.detach().clone())
            total = total + (everyone - total.detach())
        sums[name] = total
    return margin.class_regularizer(sums, num_classes)


def class_vector_dtensor(tensor: Tensor, num_classes: int, shard: ClassShard) -> Tensor:
    """This rank's block of a per-class vector as a DTensor of global shape ``[C]``, sharded
    on dim 0 (the class partition, as :func:`~marginface.head.class_rows`)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    local = tensor.detach().reshape(-1)
    mesh = DeviceMesh.from_group(shard.group or dist.group.WORLD, local.device.type)
    return DTensor.from_local(
        local, mesh, [Shard(0)], run_check=False, shape=torch.Size([num_classes]), stride=(1,)
    )


def cut_class_vector(value: Tensor, num_classes: int, start: int, stop: int) -> Tensor:
    """A saved per-class vector for the classes ``[start, stop)``: a full ``Tensor[C]`` (plain
    or a DTensor) is cut to the block; a block of that size is kept."""
    if hasattr(value, "to_local") and hasattr(value, "full_tensor"):  # a DTensor
        local = value.to_local()
        value = local if local.shape[0] == stop - start else value.full_tensor()
    if value.dim() == 1 and value.shape[0] == num_classes:
        value = value[start:stop]
    return value


def class_parameters_as_dtensors(
    state_dict: dict, prefix: str, parameters: nn.ParameterDict, num_classes: int, shard: Any
) -> None:
    """A sharded head's ``state_dict`` hook: each per-class parameter as
    :func:`class_vector_dtensor`, in place."""
    for name in parameters:
        key = f"{prefix}class_parameters.{name}"
        state_dict[key] = class_vector_dtensor(state_dict[key], num_classes, shard)


def cut_class_parameters(
    state_dict: dict,
    prefix: str,
    parameters: nn.ParameterDict,
    num_classes: int,
    class_range: tuple[int, int],
) -> None:
    """``load_state_dict`` pre-hook part: each saved per-class parameter cut to the classes
    ``class_range`` (:func:`cut_class_vector`), in place."""
    start, stop = class_range
    for name in parameters:
        key = f"{prefix}class_parameters.{name}"
        if key in state_dict:
            state_dict[key] = cut_class_vector(state_dict[key], num_classes, start, stop)
