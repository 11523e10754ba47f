"""Datasets for the pipeline: image arrays, labels and verification pairs (see :mod:`.base`).

The registry's names (:func:`list_datasets`, :func:`load_dataset`, :func:`register_dataset`)
are imported when first used: the registry imports every dataset's loader, which a command that
only reads a file of this package (``marginface search`` reaching :mod:`.download` through the
model cache) does not need.
"""

from typing import TYPE_CHECKING, Any

from .base import DatasetBundle, ImageSet, PairSet
from .download import ChecksumError, DataFilesMissingError, DownloadError
from .idx import IdxFormatError

if TYPE_CHECKING:
    from .registry import list_datasets, load_dataset, register_dataset

_REGISTRY_NAMES = ("list_datasets", "load_dataset", "register_dataset")

__all__ = [
    "ChecksumError",
    "DataFilesMissingError",
    "DatasetBundle",
    "DownloadError",
    "IdxFormatError",
    "ImageSet",
    "PairSet",
    "list_datasets",
    "load_dataset",
    "register_dataset",
]


def __getattr__(name: str) -> Any:
    """The registry's names, imported on first use (module docstring)."""
    if name in _REGISTRY_NAMES:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
