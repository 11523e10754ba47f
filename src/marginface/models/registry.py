"""Name → backbone: ``create_model("seed-cnn", embedding_dim=3, ...)``, ``list_models()``.

The face backbones are registered under insightface's ``get_model`` names (r18 ... r200, mbf,
mbf_large, vit_t, vit_s, vit_b); ``iresnet18`` and ``iresnet50`` are aliases of r18 and r50.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn

from .iresnet import IResNet
from .mobilefacenet import mbf, mbf_large
from .seed_cnn import SeedCNN
from .vit import vit_b, vit_s, vit_t

__all__ = ["create_model", "list_models"]

_MODELS: dict[str, Callable[..., nn.Module]] = {
    "seed-cnn": SeedCNN,
    "seed-cnn-bn": partial(SeedCNN, batch_norm=True),
    # insightface's names (arcface_torch ``get_model``); iresnet18/iresnet50 are aliases
    "r18": partial(IResNet, 18),
    "r34": partial(IResNet, 34),
    "r50": partial(IResNet, 50),
    "r100": partial(IResNet, 100),
    "r200": partial(IResNet, 200),
    "iresnet18": partial(IResNet, 18),
    "iresnet50": partial(IResNet, 50),
    "mbf": mbf,
    "mbf_large": mbf_large,
    "vit_t": vit_t,
    "vit_s": vit_s,
    "vit_b": vit_b,
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
