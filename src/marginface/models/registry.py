"""Name → backbone: ``create_model("seed-cnn", embedding_dim=3, ...)``, ``list_models()``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn

from .iresnet import IResNet
from .seed_cnn import SeedCNN

__all__ = ["create_model", "list_models"]

_MODELS: dict[str, Callable[..., nn.Module]] = {
    "seed-cnn": SeedCNN,
    "seed-cnn-bn": partial(SeedCNN, batch_norm=True),
    "iresnet18": partial(IResNet, 18),
    "iresnet50": partial(IResNet, 50),
}


def list_models() -> list[str]:
    """Registered backbone names, sorted."""
    return sorted(_MODELS)


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

    Unknown names raise ``ValueError`` listing the valid ones; unknown options ``TypeError``.
    """
    if not isinstance(name, str) or name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(list_models())}")
    return _MODELS[name](
        embedding_dim=embedding_dim, in_channels=in_channels, image_size=image_size, **options
    )
