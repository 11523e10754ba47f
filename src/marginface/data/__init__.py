"""Datasets for the pipeline: image arrays, labels and verification pairs (see :mod:`.base`)."""

from .base import DatasetBundle, ImageSet, PairSet
from .download import ChecksumError, DataFilesMissingError, DownloadError
from .idx import IdxFormatError
from .registry import list_datasets, load_dataset, register_dataset

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
