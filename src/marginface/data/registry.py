"""Name → dataset loader: ``load_dataset("digits")``, ``list_datasets()``.

The table is :data:`DATASETS`, a :class:`~marginface._registry.Registry` (names
case-insensitive, ``_`` and ``-`` interchangeable). A loader takes keyword options only
(``data_dir``, ``download``, ``image_size``, ``seed``, ``limit``, and its own) and returns a
:class:`~marginface.data.base.DatasetBundle`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._registry import Registry
from .base import DatasetBundle
from .digits import load_digits
from .folder import load_folder
from .insightface import load_insightface
from .lfw import load_lfw
from .mnist import load_fashion_mnist, load_mnist
from .omniglot import load_omniglot
from .orl import load_orl
from .yaleb import load_yaleb

__all__ = ["DATASETS", "list_datasets", "load_dataset", "register_dataset"]

DATASETS: Registry[Callable[..., DatasetBundle]] = Registry("dataset")
"""Registered dataset name → loader ``(**options) -> DatasetBundle``."""

DATASETS.add("digits", load_digits)
DATASETS.add("mnist", load_mnist)
DATASETS.add("fashion-mnist", load_fashion_mnist)
DATASETS.add("omniglot", load_omniglot)
DATASETS.add("folder", load_folder)
DATASETS.add("lfw", load_lfw)
DATASETS.add("orl", load_orl)
DATASETS.add("yaleb", load_yaleb)
DATASETS.add("insightface", load_insightface)


def register_dataset(name: str, loader: Callable[..., DatasetBundle]) -> None:
    """Register ``loader(**options) -> DatasetBundle`` under ``name``; a name already taken
    raises ``ValueError``."""
    DATASETS.add(name, loader)


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    return DATASETS.names()


def load_dataset(name: str, **options: Any) -> DatasetBundle:
    """Load a registered dataset; ``ValueError`` listing the valid names for an unknown one (or a
    name that is not a string).

    Options are the loader's keyword arguments (``data_dir``, ``seed``, ...); a loader rejects
    options it does not know with ``TypeError``.
    """
    if not isinstance(name, str):
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(list_datasets())}")
    return DATASETS.get(name)(**options)
