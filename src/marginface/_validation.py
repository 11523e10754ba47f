"""Argument checks shared by the public API.

Every check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, bad value)
with a message that names the argument and shows the offending value, so a mistake is reported
at the API boundary rather than as a NaN or an index error from deep inside torch.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from pathlib import Path

import torch

__all__ = [
    "check_choice",
    "check_device",
    "check_dtype",
    "check_embeddings",
    "check_int",
    "check_labels",
    "check_real",
    "check_representable",
    "is_same_or_inside",
    "read_utf8_text",
]


def check_real(
    name: str,
    value: object,
    *,
    positive: bool = False,
    nonnegative: bool = False,
    below: float | None = None,
    at_most: float | None = None,
) -> float:
    """Return ``value`` as a finite float, or raise naming ``name``.

    Args:
        name: the argument's name, as the user wrote it.
        value: the value to check (``bool`` is rejected even though it is an ``int``).
        positive: require ``value > 0``.
        nonnegative: require ``value >= 0``.
        below: require ``value < below``.
        at_most: require ``value <= at_most``.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and result <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and result < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if below is not None and result >= below:
        raise ValueError(f"{name} must be < {below:g}, got {value!r}")
    if at_most is not None and result > at_most:
        raise ValueError(f"{name} must be <= {at_most:g}, got {value!r}")
    return result


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``name`` (floats and bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    result = int(value)
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return result


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing the valid ones."""
    if not isinstance(value, str) or value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {valid}, got {value!r}")
    return value


def check_embeddings(embeddings: object, embedding_dim: int | None = None) -> torch.Tensor:
    """Check a batch of embeddings: a finite floating tensor of shape ``(N, D)`` with ``N >= 1``.

    Args:
        embeddings: the candidate tensor.
        embedding_dim: the expected ``D``, or ``None`` to accept any.

    Under ``torch.compile`` (:func:`torch.compiler.is_compiling`) the finiteness check, which
    reads the values back to the host, is skipped; types and shapes are still checked.

    Returns:
        ``embeddings`` unchanged.
    """
    if not isinstance(embeddings, torch.Tensor):
        raise TypeError(f"embeddings must be a torch.Tensor, got {type(embeddings).__name__}")
    if not embeddings.is_floating_point():
        raise TypeError(f"embeddings must have a floating dtype, got {embeddings.dtype}")
    if embeddings.dim() != 2:
        raise ValueError(
            f"embeddings must have shape (N, D), got {tuple(embeddings.shape)} "
            f"({embeddings.dim()} dimensions)"
        )
    if embeddings.shape[0] == 0:
        raise ValueError("embeddings is an empty batch (N = 0); a loss needs at least one sample")
    if embedding_dim is not None and embeddings.shape[1] != embedding_dim:
        raise ValueError(
            f"embeddings must have D = embedding_dim = {embedding_dim} columns, "
            f"got shape {tuple(embeddings.shape)}"
        )
    if torch.compiler.is_compiling():  # a value check is a host sync: a graph break
        return embeddings
    if not bool(torch.isfinite(embeddings).all()):
        bad = int((~torch.isfinite(embeddings)).any(dim=1).sum())
        raise ValueError(f"embeddings contain non-finite values (NaN or inf) in {bad} row(s)")
    return embeddings


def check_labels(
    labels: object, batch_size: int, num_classes: int, *, allow_missing: bool = False
) -> torch.Tensor:
    """Check class labels: an integer tensor of shape ``(N,)`` with values in ``[0, num_classes)``.

    Args:
        labels: the candidate tensor.
        batch_size: the expected ``N`` (rows of the embeddings or cosines).
        num_classes: ``C``; every label must be ``< C``.
        allow_missing: also accept ``-1``, meaning "this row's class is not among these C" (the
            convention of class-sharded executors).

    Under ``torch.compile`` the range check, which reads the values back to the host, is
    skipped; type and shape are still checked.

    Returns:
        ``labels`` as ``int64`` (every integer dtype — int8, int16, int32, uint8... — is
        accepted and converted, so that no executor mistakes ``uint8`` labels for a mask).
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"labels must have an integer dtype (e.g. torch.long), got {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"labels must have shape (N,), got {tuple(labels.shape)}")
    if labels.shape[0] != batch_size:
        raise ValueError(
            f"labels must have one entry per row: expected N = {batch_size}, got {labels.shape[0]}"
        )
    low = -1 if allow_missing else 0
    if labels.numel() > 0 and not torch.compiler.is_compiling():  # no host sync under compile
        smallest, largest = int(labels.min()), int(labels.max())
        if smallest < low or largest >= num_classes:
            bad = smallest if smallest < low else largest
            raise ValueError(
                f"labels must lie in [{low}, {num_classes - 1}] for num_classes = {num_classes}, "
                f"got {bad}"
            )
    return labels if labels.dtype == torch.int64 else labels.to(torch.int64)


def check_device(name: str, value: object) -> torch.device | None:
    """``value`` as a ``torch.device`` (None stays None): a ``torch.device``, a string torch
    parses (``"cpu"``, ``"cuda:1"``) or a CUDA index; ``TypeError``/``ValueError`` naming
    ``name`` otherwise."""
    if value is None or isinstance(value, torch.device):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, Integral)):
        raise TypeError(
            f"{name} must be a torch.device, a device string or an index, got {value!r} "
            f"({type(value).__name__})"
        )
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as error:
        raise ValueError(
            f"{name} must name a device such as 'cpu', 'cuda' or 'cuda:1', got {value!r}"
        ) from error


def check_dtype(name: str, value: object, *, floating: bool = True) -> torch.dtype | None:
    """``value`` if it is a ``torch.dtype`` (floating when ``floating``) or None; a string such
    as ``"float32"`` is a ``TypeError`` that names the dtype to pass instead."""
    if value is None:
        return None
    if isinstance(value, str):
        hint = getattr(torch, value, None)
        instead = f"torch.{value}" if isinstance(hint, torch.dtype) else "a torch.dtype"
        raise TypeError(f"{name} must be a torch.dtype, not the string {value!r}; pass {instead}")
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {value!r} ({type(value).__name__})")
    if floating and not value.is_floating_point:
        raise TypeError(f"{name} must be a floating dtype, got {value}")
    return value


def check_representable(name: str, value: float, dtype: torch.dtype) -> float:
    """``value`` if its magnitude is finite in ``dtype`` (the dtype the math runs in), else a
    ``ValueError`` naming ``name``: ``scale = 1e39`` is finite in Python but inf in float32."""
    limit = torch.finfo(dtype).max
    if abs(value) > limit:
        raise ValueError(
            f"{name} = {value!r} is not finite in {str(dtype).replace('torch.', '')} (largest "
            f"{limit:.3g}), the dtype the loss computes in"
        )
    return value


def read_utf8_text(path: str | os.PathLike[str], advice: str) -> str:
    """``path``'s text, decoded as UTF-8; a file in another encoding is one ``ValueError``
    naming it and the first bad byte, then ``advice`` (what the user should do)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {error.start}: {error.reason}); {advice}"
        ) from None


def is_same_or_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, both resolved (links, ``..``): an
    output there would be written among the input's files."""
    inner, outer = Path(path).resolve(), Path(folder).resolve()
    return inner == outer or outer in inner.parents
