"""Name → dataset loader: ``load_dataset("digits")``, ``list_datasets()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import DatasetBundle
from .digits import load_digits
from .folder import load_folder
from .insightface import load_insightface
from .lfw import load_lfw
from .mnist import load_fashion_mnist, load_mnist
from .omniglot import load_omniglot
from .orl import load_orl
from .yaleb import load_yaleb

__all__ = ["list_datasets", "load_dataset", "register_dataset"]

_LOADERS: dict[str, Callable[..., DatasetBundle]] = {
    "digits": load_digits,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "omniglot": load_omniglot,
    "folder": load_folder,
    "lfw": load_lfw,
    "orl": load_orl,
    "yaleb": load_yaleb,
    "insightface": load_insightface,
}


def register_dataset(name: str, loader: Callable[..., DatasetBundle]) -> None:
    """Register ``loader(**options) -> DatasetBundle`` under ``name``."""
    if name in _LOADERS:
        raise ValueError(f"a dataset named {name!r} is already registered")
    _LOADERS[name] = loader


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    return sorted(_LOADERS)


def load_dataset(name: str, **options: Any) -> DatasetBundle:
    """Load a registered dataset; ``ValueError`` listing the valid names for an unknown one.

    Options are the loader's keyword arguments (``data_dir``, ``seed``, ...); a loader rejects
    options it does not know with ``TypeError``.
    """
    if not isinstance(name, str) or name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(list_datasets())}")
    return _LOADERS[name](**options)
