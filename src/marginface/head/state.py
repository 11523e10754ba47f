"""The state of a :class:`~marginface.head.MarginSoftmaxLoss` as checkpoints hold it: one row
per class (``[C, K·D]``), a DTensor sharded on dim 0 for a class-sharded head, so that
``torch.distributed.checkpoint`` reshards it to any number of ranks; and the hooks that save
and load that layout (docs/distributed.md)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..class_parameters import (
    class_parameters_as_dtensors,
    class_vector_dtensor,
    cut_class_parameters,
)

__all__ = [
    "class_rows",
    "class_state_view",
    "full_weight_to_shard",
    "per_class_parameters",
    "reshardable_state_dict",
    "weight_as_dtensor",
]


def _is_head(module: object) -> bool:
    """Whether ``module`` is a margin head (:class:`~marginface.head.MarginSoftmaxLoss` or a
    subclass; checked by what it holds, so that this module does not import the head)."""
    return isinstance(module, nn.Module) and all(
        hasattr(module, name) for name in ("class_range", "sub_centers", "shard", "num_classes")
    )


def reshardable_state_dict(loss: nn.Module) -> dict[str, Any]:
    """``loss.state_dict()`` laid out for ``torch.distributed.checkpoint``, sharded or not.

    The weight appears as ``Tensor[C, K·D]`` (one row per class, its ``K`` sub-centers side by
    side): a DTensor sharded on dim 0 for a sharded head (its ``state_dict()`` already is
    this), a plain view for an unsharded one. Both share storage with the weight, so
    ``torch.distributed.checkpoint.load(reshardable_state_dict(loss), ...)`` restores the
    weight in place, whatever the number of ranks that saved it; the margin's buffers are
    replicated tensors. For ``K = 1`` this is just ``loss.state_dict()``.
    """
    if not _is_head(loss):
        raise TypeError(f"loss must be a MarginSoftmaxLoss, got {type(loss).__name__}")
    state = loss.state_dict(keep_vars=False)
    if loss.shard is None:
        k, d = loss.sub_centers, loss.embedding_dim
        state["weight"] = loss.weight.detach().view(loss.num_classes, k * d)
    return state


def class_rows(tensor: Tensor, loss: nn.Module) -> Tensor:
    """A tensor shaped like ``loss.weight`` (the weight itself, or optimizer state of it),
    viewed as one row per class, ``[c, K·D]``, sharing its storage; for a sharded head a
    DTensor of global shape ``[C, K·D]`` sharded on dim 0 (``torch.chunk``'s split, which is
    the class partition), the layout ``torch.distributed.checkpoint`` reshards."""
    k, d = loss.sub_centers, loss.embedding_dim
    rows = tensor.detach().reshape(-1, k * d)
    if loss.shard is None:
        return rows
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = DeviceMesh.from_group(loss.shard.group or dist.group.WORLD, rows.device.type)
    return DTensor.from_local(
        rows,
        mesh,
        [Shard(0)],
        run_check=False,
        shape=torch.Size([loss.num_classes, k * d]),
        stride=(k * d, 1),
    )


def per_class_parameters(loss: nn.Module) -> dict[str, nn.Parameter]:
    """The head's parameters that hold one entry per class, by their ``state_dict`` name: the
    class centers ``"weight"`` (``[c·K, D]``) and each per-class parameter
    ``"class_parameters.<name>"`` (``[c]``, :mod:`marginface.class_parameters`); on a
    class-sharded head, this rank's block of each (the classes :attr:`class_range`)."""
    parameters = {"weight": loss.weight}
    for name, parameter in loss.class_parameters.items():
        parameters[f"class_parameters.{name}"] = parameter
    return parameters


def class_state_view(tensor: Tensor, loss: nn.Module, name: str) -> Tensor:
    """A tensor shaped like the per-class parameter ``name`` of :func:`per_class_parameters`
    (the parameter itself, or optimizer state of it: SGD's momentum, Adam's moments) in the
    layout ``torch.distributed.checkpoint`` reshards, sharing its storage: :func:`class_rows`
    for the centers (``[C, K·D]``); a vector ``[C]`` for a per-class parameter, a DTensor
    sharded on dim 0 (the class partition) on a class-sharded head."""
    if name == "weight":
        return class_rows(tensor, loss)
    if loss.shard is None:
        return tensor.detach().reshape(-1)
    return class_vector_dtensor(tensor, loss.num_classes, loss.shard)


def weight_as_dtensor(
    module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any
) -> dict:
    """``state_dict`` hook of a sharded head: the weight block as :func:`class_rows`, each
    per-class parameter as a DTensor of global shape ``[C]`` sharded on dim 0."""
    state_dict[prefix + "weight"] = class_rows(state_dict[prefix + "weight"], module)
    class_parameters_as_dtensors(
        state_dict, prefix, module.class_parameters, module.num_classes, module.shard
    )
    return state_dict


def full_weight_to_shard(
    module: nn.Module, state_dict: dict, prefix: str, *args: Any, **kwargs: Any
) -> None:
    """``load_state_dict`` pre-hook: accept the weight as an unsharded loss saves it
    (``Tensor[C·K, D]``) or in the resharding layout (``Tensor[C, K·D]``, plain or a
    DTensor), and cut it to this rank's block; the same for each per-class parameter
    (``Tensor[C]``, plain or a DTensor)."""
    if not _is_head(module):
        return
    parameters, count = module.class_parameters, module.num_classes
    cut_class_parameters(state_dict, prefix, parameters, count, module.class_range)
    key = prefix + "weight"
    if key not in state_dict:
        return
    value = state_dict[key]
    start, stop = module.class_range
    k, d = module.sub_centers, module.embedding_dim
    if hasattr(value, "to_local") and hasattr(value, "full_tensor"):  # a DTensor
        local = value.to_local()
        if module.shard is not None and local.shape[0] == stop - start:
            state_dict[key] = local.reshape((stop - start) * k, d)
            return
        value = value.full_tensor()
    if k > 1 and value.dim() == 2 and tuple(value.shape) == (module.num_classes, k * d):
        value = value.reshape(module.num_classes * k, d)
    if value.dim() == 2 and value.shape[0] == module.num_classes * k:
        value = value[start * k : stop * k]
    state_dict[key] = value
