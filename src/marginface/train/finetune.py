"""Fine-tuning a pretrained backbone (``TrainConfig.init_from``, the ``finetune`` recipe):
what the model's description says, its weights, which of its stages are frozen, and class
centers started at the class-mean embeddings (docs/training.md).

Stages (:func:`model_stages`), counted from the input:

* ``dlib-resnet-v1`` (:class:`~marginface.models.dlib_resnet.DlibResNet`), 6 stages: the stem
  (7×7/2 convolution, affine, max pool), then ``stages.0`` … ``stages.4`` (32, 64, 128, 256,
  256 channels). Its ``fc`` (256 → 128) is never frozen.
* IResNet (``r18`` … ``r200``, :class:`~marginface.models.iresnet.IResNet`), 5 stages: the stem
  (``conv1``, ``bn1``, ``prelu``), then ``layer1`` … ``layer4``. ``bn2``, ``fc`` and
  ``features`` are never frozen.

``freeze_stages = K`` freezes the first ``K``: their parameters get ``requires_grad = False``
(no gradient; :func:`~marginface.train.build.build_training` leaves them out of the optimizer)
and their BatchNorm layers stay in eval mode (running statistics as loaded) whatever mode the
model is put in. dlib's affines have no statistics: their scale and shift are parameters,
frozen with the rest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.description import ModelDescription

__all__ = [
    "class_mean_centers",
    "freeze_stages",
    "init_centers_from_class_means",
    "model_stages",
    "pretrained_description",
    "pretrained_state",
    "stage_count",
]


def pretrained_description(init_from: str | os.PathLike[str]) -> ModelDescription | None:
    """The description of the model ``init_from`` names: a file's (a path that exists wins;
    :func:`~marginface.models.description.read_description`; None when it carries none) or a
    pretrained model's (:mod:`marginface.models.catalogue`).

    Raises:
        ValueError: neither a file nor a pretrained name (with the closest name); a folder; a
            model that cannot be trained here (an ONNX graph, an unregistered architecture).
    """
    from ..models.catalogue import find_pretrained, is_pretrained_name
    from ..models.description import read_description

    path = Path(init_from)
    if path.is_dir():
        raise ValueError(
            f"init_from {str(init_from)!r} is a folder; give its checkpoint.pt or an exported "
            "backbone file"
        )
    if path.is_file():
        description = read_description(path)
    elif is_pretrained_name(str(init_from)):
        description = find_pretrained(str(init_from)).description
    else:
        from .._registry import describe_unknown
        from ..models.catalogue import PRETRAINED

        names = PRETRAINED.names(include_aliases=True)
        raise ValueError(
            f"init_from {str(init_from)!r} is no file and no pretrained model "
            f"({describe_unknown([str(init_from)], names)}); `marginface models` lists them"
        )
    if description is not None:
        _check_trainable(str(init_from), description)
    return description


def _check_trainable(source: str, description: ModelDescription) -> None:
    from ..models.registry import MODELS

    if description.architecture == "onnx":
        raise ValueError(
            f"{source} is an ONNX graph: its weights cannot be trained here; fine-tune a "
            "PyTorch backbone (a pretrained name with a registered architecture, or a .pt / "
            ".safetensors file)"
        )
    if description.architecture not in MODELS:
        raise ValueError(
            f"{source} is a {description.architecture!r} model, which is not a registered "
            f"backbone here (valid: {', '.join(MODELS.names())})"
        )


def pretrained_state(init_from: str | os.PathLike[str], model: str) -> dict[str, Tensor]:
    """The backbone weights ``init_from`` names, for architecture ``model``: a file's
    (:func:`~marginface.models.pretrained.read_backbone_state`; a path that exists wins) or a
    pretrained model's, read by its loader
    (:func:`~marginface.models.catalogue.open_pretrained`: dlib's file needs no dlib).

    Raises:
        ValueError: an unreadable file, an unknown name, a pretrained file not on this machine
            (one line saying where to get it).
    """
    from ..models.catalogue import open_pretrained
    from ..models.pretrained import read_backbone_state

    if Path(init_from).exists():
        return read_backbone_state(init_from, model)[0]
    module, _, _ = open_pretrained(str(init_from))
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _is_iresnet(factory: Any) -> bool:
    from ..models.iresnet import IResNet

    return factory is IResNet or getattr(factory, "func", None) is IResNet


def stage_count(architecture: str) -> int | None:
    """The number of stages :func:`model_stages` defines for a registered architecture
    (``dlib-resnet-v1``: 6, IResNet: 5), or None (none defined, or not registered)."""
    from ..models.dlib_resnet import dlib_resnet_v1
    from ..models.registry import MODELS

    if not isinstance(architecture, str) or architecture not in MODELS:
        return None
    factory = MODELS.get(architecture)
    if factory is dlib_resnet_v1:
        return 6
    return 5 if _is_iresnet(factory) else None


def model_stages(model: nn.Module) -> list[list[nn.Module]]:
    """The stages of ``model`` from the input, each the list of its modules (see the module
    docstring): 6 for a :class:`~marginface.models.dlib_resnet.DlibResNet`, 5 for an
    :class:`~marginface.models.iresnet.IResNet`.

    Raises:
        ValueError: another architecture (no stages defined).
    """
    from ..models.dlib_resnet import DlibResNet
    from ..models.iresnet import IResNet

    if isinstance(model, DlibResNet):
        return [[model.stem], *[[stage] for stage in model.stages]]
    if isinstance(model, IResNet):
        return [[model.conv1, model.bn1, model.prelu], *[[stage] for stage in model.stages()]]
    raise ValueError(
        f"freeze_stages is defined for dlib-resnet-v1 and IResNet (r18 ... r200), not for "
        f"{type(model).__name__}"
    )


def _keep_eval(module: nn.Module, _inputs: Any) -> None:
    """Forward pre-hook of a frozen BatchNorm: evaluate with the loaded statistics."""
    module.training = False


def freeze_stages(model: nn.Module, count: int) -> list[nn.Parameter]:
    """Freeze the first ``count`` stages of ``model`` (:func:`model_stages`): their parameters
    ``requires_grad_(False)``, their BatchNorm layers kept in eval mode (a forward pre-hook,
    so ``model.train()`` does not update the running statistics). ``count = 0`` does nothing.

    Returns:
        The frozen parameters (leave them out of the optimizer).

    Raises:
        ValueError: ``count`` < 0 or more than the model's stages; a model without stages.
        TypeError: ``count`` not an int.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"freeze_stages must be an int, got {count!r}")
    if count < 0:
        raise ValueError(f"freeze_stages must be >= 0, got {count}")
    if count == 0:
        return []
    stages = model_stages(model)
    if count > len(stages):
        raise ValueError(
            f"freeze_stages = {count}, but {type(model).__name__} has {len(stages)} stages"
        )
    frozen: list[nn.Parameter] = []
    for stage in stages[:count]:
        for module in stage:
            for parameter in module.parameters():
                parameter.requires_grad_(False)
                frozen.append(parameter)
            for inner in module.modules():
                if isinstance(inner, nn.modules.batchnorm._BatchNorm):
                    inner.eval()
                    inner.register_forward_pre_hook(_keep_eval)
    return frozen


def class_mean_centers(
    embeddings: Tensor, labels: Tensor, num_classes: int
) -> tuple[Tensor, Tensor]:
    """Class centers at the class-mean directions: ``c_k = normalise(mean_{i: y_i = k}
    normalise(e_i))``.

    Args:
        embeddings: ``Tensor[N, D]``, not necessarily normalised.
        labels: ``int64[N]`` in ``[0, num_classes)``.
        num_classes: ``C``.

    Returns:
        ``(centers Tensor[C, D], present bool[C])``: unit rows for the classes with at least
        one embedding; zero rows where ``present`` is False.
    """
    unit = F.normalize(embeddings.float(), dim=1)
    sums = torch.zeros(num_classes, unit.shape[1], dtype=unit.dtype)
    sums.index_add_(0, labels.long().cpu(), unit.cpu())
    counts = torch.bincount(labels.long().cpu(), minlength=num_classes)
    present = counts > 0
    means = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
    return F.normalize(means, dim=1) * present.unsqueeze(1), present


@torch.no_grad()
def init_centers_from_class_means(
    model: nn.Module,
    head: nn.Module,
    train: Any,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    channels_last: bool = False,
) -> Tensor:
    """Set ``head``'s class centers to :func:`class_mean_centers` of ``model``'s embeddings of
    the training set ``train`` (an :class:`~marginface.data.base.ImageSet` already fed as the
    model takes it, or a streamed set), model in eval mode.

    ``head.weight`` is ``[c·K, D]``, class-major for ``K`` sub-centers, for the classes of
    ``head.class_range`` (this rank's block when sharded): sub-center 0 of each class with
    images becomes its center, the other sub-centers keep their random draws (identical
    sub-centers would never separate); classes without images keep theirs.

    Returns:
        The centers ``Tensor[C, D]`` of every class (zero rows for classes without images).
    """
    from ..data.base import StreamedImageSet
    from .embeddings import extract_dataset_embeddings, extract_embeddings

    if isinstance(train, StreamedImageSet):
        embeddings = extract_dataset_embeddings(
            model, train.unaugmented().dataset, batch_size=batch_size, device=device,
            labels=train.labels, channels_last=channels_last, desc="class means",
        )  # fmt: skip
    else:
        embeddings = extract_embeddings(
            model, train.images, batch_size=batch_size, device=device,
            channels_last=channels_last, desc="class means",
        )  # fmt: skip
    labels = torch.as_tensor(np.asarray(train.labels), dtype=torch.int64)
    num_classes = int(getattr(head, "num_classes", train.num_classes))
    centers, present = class_mean_centers(embeddings, labels, num_classes)
    start, stop = getattr(head, "class_range", (0, num_classes))
    sub = int(getattr(head, "sub_centers", 1))
    weight = head.weight
    for k in range(start, stop):
        if present[k]:
            weight[(k - start) * sub] = centers[k].to(weight.device, weight.dtype)
    return centers
