"""Conversions and checks shared by the metrics and the plots: tensors or arrays in, NumPy out.

Every check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, bad value)
naming the argument, so a mistake is reported at the API boundary.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "ArrayLike",
    "as_bool_vector",
    "as_embeddings",
    "as_float_vector",
    "as_int_vector",
    "to_numpy",
]

ArrayLike = np.ndarray | torch.Tensor
"""What the metrics accept: a tensor (any device; detached) or a NumPy array."""


def to_numpy(name: str, value: object) -> np.ndarray:
    """``value`` as a NumPy array (a tensor is detached and moved to the CPU; not copied else).

    Raises ``TypeError`` naming ``name`` for anything that is not a tensor, an array, a list or
    a tuple.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()
        return tensor.numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):
        return np.asarray(value)
    raise TypeError(f"{name} must be a torch.Tensor or a numpy.ndarray, got {type(value).__name__}")


def as_embeddings(name: str, value: object, *, min_rows: int = 1) -> np.ndarray:
    """A finite ``float64[N, D]`` array with ``N >= min_rows``."""
    array = to_numpy(name, value)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (N, D), got {array.shape}")
    if array.shape[0] < min_rows:
        raise ValueError(f"{name} must have at least {min_rows} row(s), got shape {array.shape}")
    if array.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column, got shape {array.shape}")
    array = array.astype(np.float64, copy=False)
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).any(axis=1).sum())
        raise ValueError(f"{name} contains non-finite values (NaN or inf) in {bad} row(s)")
    return array


def as_float_vector(name: str, value: object, *, length: int | None = None) -> np.ndarray:
    """A finite ``float64[P]`` array (of length ``length`` when given)."""
    array = to_numpy(name, value)
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must have shape (P,), got {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {array.shape[0]}")
    array = array.astype(np.float64, copy=False)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return array


def as_int_vector(name: str, value: object, *, length: int | None = None) -> np.ndarray:
    """An ``int64[N]`` array (of length ``length`` when given); floats and bools are rejected."""
    array = to_numpy(name, value)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype, got {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {array.shape[0]}")
    return array.astype(np.int64, copy=False)


def as_bool_vector(name: str, value: object, *, length: int | None = None) -> np.ndarray:
    """A ``bool[P]`` array; integer input must be 0/1 only."""
    array = to_numpy(name, value)
    if array.ndim != 1:
        raise ValueError(f"{name} must have shape (P,), got {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {array.shape[0]}")
    if array.dtype == np.bool_:
        return array
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must be boolean (or 0/1 integers), got dtype {array.dtype}")
    if array.size and not np.isin(array, (0, 1)).all():
        bad = array[~np.isin(array, (0, 1))][0]
        raise ValueError(f"{name} must hold only 0 and 1 when given as integers, got {bad}")
    return array.astype(bool)
