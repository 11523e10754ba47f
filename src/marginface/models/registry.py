"""Name → backbone: ``create_model("seed-cnn", embedding_dim=3, ...)``, ``list_models()``.

The table is :data:`MODELS`, a :class:`~marginface._registry.Registry` (names case-insensitive,
``_`` and ``-`` interchangeable). A backbone factory takes ``embedding_dim``, ``in_channels`` and
``image_size`` as keywords (plus its own options) and returns an ``nn.Module`` mapping
``Tensor[N, in_channels, H, W]`` to ``Tensor[N, embedding_dim]``; register one with
:func:`register_model` (docs/architecture.md, "Adding a backbone").

The face backbones are registered under insightface's ``get_model`` names (r18 ... r200, mbf,
mbf_large, vit_t, vit_s, vit_b; docs/backbones.md); ``iresnet18`` and ``iresnet50`` build the
same models as r18 and r50.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from torch import nn

from .._registry import Registry
from .dlib_resnet import dlib_resnet_v1
from .iresnet import IResNet
from .mobilefacenet import mbf, mbf_large
from .seed_cnn import SeedCNN
from .vit import vit_b, vit_s, vit_t

__all__ = ["MODELS", "create_model", "list_models", "register_model"]

F = TypeVar("F", bound=Callable[..., nn.Module])

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
"""Registered backbone name → factory ``(*, embedding_dim, in_channels, image_size, **options)``."""

MODELS.add("seed-cnn", SeedCNN)
MODELS.add("seed-cnn-bn", partial(SeedCNN, batch_norm=True))
# insightface's names (arcface_torch ``get_model``); iresnet18/iresnet50, the names of earlier
# versions, stay listed (the same factories as r18/r50)
MODELS.add("iresnet18", partial(IResNet, 18))
MODELS.add("iresnet50", partial(IResNet, 50))
MODELS.add("r18", partial(IResNet, 18))
MODELS.add("r34", partial(IResNet, 34))
MODELS.add("r50", partial(IResNet, 50))
MODELS.add("r100", partial(IResNet, 100))
MODELS.add("r200", partial(IResNet, 200))
MODELS.add("mbf", mbf)
MODELS.add("mbf_large", mbf_large)
MODELS.add("vit_t", vit_t)
MODELS.add("vit_s", vit_s)
MODELS.add("vit_b", vit_b)
# dlib's face recognition ResNet v1 (150x150 chips -> 128-d); load_dlib_resnet reads its weights
MODELS.add("dlib-resnet-v1", dlib_resnet_v1)


def register_model(name: str, *aliases: str) -> Callable[[F], F]:
    """Decorator: register a backbone factory (a class or a function) under ``name`` and
    ``aliases``; a name already taken raises ``ValueError``."""
    return MODELS.register(name, *aliases)


def list_models() -> list[str]:
    """Registered backbone names, sorted."""
    return MODELS.names()


def create_model(
    name: str,
    *,
    embedding_dim: int,
    in_channels: int,
    image_size: int,
    **options: Any,
) -> nn.Module:
    """Build a registered backbone ``Tensor[N, in_channels, image_size, image_size] ->
    Tensor[N, embedding_dim]``.

    Unknown names (or a name that is not a string) raise ``ValueError`` listing the valid ones;
    unknown options ``TypeError``.
    """
    if not isinstance(name, str):
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(list_models())}")
    return MODELS.get(name)(
        embedding_dim=embedding_dim, in_channels=in_channels, image_size=image_size, **options
    )
