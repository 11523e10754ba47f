"""Fingerprints that key embeddings kept on disk: of a model's weights
(:func:`weights_fingerprint`) and of a set of images (:func:`data_fingerprint`).

An embedding depends on the weights, the images and the embedder's options (flip test,
normalisation, autocast type); the device, batch size and memory format change it by float32
rounding only. The one embedding cache (:mod:`marginface.inference.embedding_cache`) keys
every kept embedding with these (a run's evaluation embeddings, IJB's features, ``embed``'s
output); they import nothing of training.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["data_fingerprint", "weights_fingerprint"]

_SAMPLED_ROWS = 64  # image rows hashed by data_fingerprint (evenly spaced)


def weights_fingerprint(model: nn.Module) -> str:
    """A BLAKE2b digest (hex, 32 characters) of ``model.state_dict()``: every entry's name,
    dtype, shape and bytes (in row-major order, whatever the memory format), so two models
    have the same fingerprint exactly when they compute with the same weights and buffers.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (named).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    digest = hashlib.blake2b(digest_size=16)
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        if not isinstance(value, torch.Tensor):
            digest.update(repr(value).encode())
            continue
        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{tensor.dtype}{tuple(value.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def data_fingerprint(images: Any, *others: Any) -> str:
    """A BLAKE2b digest (hex) of a set of images (their shape, dtype and 64 evenly spaced
    rows: cheap for a large set, and any other image file gives another digest) and of
    ``others`` whole (labels, pair indices: small arrays)."""
    digest = hashlib.blake2b(digest_size=16)
    array = np.asarray(images)
    digest.update(f"{array.dtype}{array.shape}".encode())
    if len(array):
        rows = np.unique(np.linspace(0, len(array) - 1, _SAMPLED_ROWS).astype(np.int64))
        digest.update(np.ascontiguousarray(array[rows]).tobytes())
    for other in others:
        other = np.ascontiguousarray(np.asarray(other))
        digest.update(f"{other.dtype}{other.shape}".encode())
        digest.update(other.tobytes())
    return digest.hexdigest()
