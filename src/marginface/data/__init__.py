"""Datasets for the pipeline: image arrays, labels and verification pairs (see :mod:`.base`)."""

from .base import DatasetBundle, ImageSet, PairSet

__all__ = ["DatasetBundle", "ImageSet", "PairSet"]
