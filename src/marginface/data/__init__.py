"""Datasets for the pipeline: image arrays, labels and verification pairs (see :mod:`.base`)."""

from .base import DatasetBundle, ImageSet, PairSet
from .registry import list_datasets, load_dataset, register_dataset

__all__ = [
    "DatasetBundle",
    "ImageSet",
    "PairSet",
    "list_datasets",
    "load_dataset",
    "register_dataset",
]
