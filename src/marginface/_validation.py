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
    "check_values",
    "is_same_or_inside",
    "read_utf8_text",
    "set_value_checks",
    "value_checks_enabled",
]

_value_checks = True  # the process-wide switch of set_value_checks


def set_value_checks(enabled: bool) -> bool:
    """Turn the value checks of the loss API on (the default) or off, for the whole process.

    The value checks read tensors back to the host: the embeddings' finiteness
    (``torch.isfinite``) and the labels' range ``[0, C)`` (their minimum and maximum), one read
    per step (:func:`check_values`). On a GPU that read is a synchronization: the host waits for
    every kernel already queued before it queues the next, so its work for a step (the launches)
    cannot overlap the device's work for the previous one. ``set_value_checks(False)`` skips the
    reads, as ``torch.compile`` always does (:func:`torch.compiler.is_compiling`); types and
    shapes are still checked. Without them a label out of range indexes out of bounds in the
    executor (on CUDA a device-side assert or an illegal memory access) and a NaN embedding
    gives a NaN loss. The switch follows ``torch.distributions.Distribution.
    set_default_validate_args``.

    Args:
        enabled: ``True`` to check values, ``False`` to skip the host reads.

    Returns:
        The previous setting, to restore it.
    """
    global _value_checks
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {enabled!r} ({type(enabled).__name__})")
    previous, _value_checks = _value_checks, enabled
    return previous


def value_checks_enabled() -> bool:
    """Whether :func:`set_value_checks` left the value checks on and the caller is not being
    traced by ``torch.compile`` (where a read back to the host would break the graph)."""
    return _value_checks and not torch.compiler.is_compiling()


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


def check_embeddings(
    embeddings: object, embedding_dim: int | None = None, *, values: bool = True
) -> torch.Tensor:
    """Check a batch of embeddings: a finite floating tensor of shape ``(N, D)`` with ``N >= 1``.

    Args:
        embeddings: the candidate tensor.
        embedding_dim: the expected ``D``, or ``None`` to accept any.
        values: check finiteness too (a read back to the host); ``False`` when the caller
            checks the values itself (:func:`check_values`, one read for a batch).

    The finiteness check is skipped when :func:`value_checks_enabled` is false (under
    ``torch.compile``, or after ``set_value_checks(False)``); types and shapes are still checked.

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
    if values and value_checks_enabled():
        _raise_unless_finite(embeddings, bool(torch.isfinite(embeddings).all()))
    return embeddings


def _raise_unless_finite(embeddings: torch.Tensor, finite: bool) -> None:
    """The ``ValueError`` for non-finite embeddings (rows counted only once known to fail)."""
    if not finite:
        bad = int((~torch.isfinite(embeddings)).any(dim=1).sum())
        raise ValueError(f"embeddings contain non-finite values (NaN or inf) in {bad} row(s)")


def check_labels(
    labels: object,
    batch_size: int,
    num_classes: int,
    *,
    allow_missing: bool = False,
    values: bool = True,
) -> torch.Tensor:
    """Check class labels: an integer tensor of shape ``(N,)`` with values in ``[0, num_classes)``.

    Args:
        labels: the candidate tensor.
        batch_size: the expected ``N`` (rows of the embeddings or cosines).
        num_classes: ``C``; every label must be ``< C``.
        allow_missing: also accept ``-1``, meaning "this row's class is not among these C" (the
            convention of class-sharded executors).
        values: check the range too (a read back to the host); ``False`` when the caller
            checks the values itself (:func:`check_values`).

    The range check is skipped when :func:`value_checks_enabled` is false (under
    ``torch.compile``, or after ``set_value_checks(False)``); type and shape are still checked.

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
    if values and labels.numel() > 0 and value_checks_enabled():
        smallest, largest = torch.stack(torch.aminmax(labels)).tolist()  # one read
        _raise_unless_in_range(smallest, largest, num_classes, -1 if allow_missing else 0)
    return labels if labels.dtype == torch.int64 else labels.to(torch.int64)


def _raise_unless_in_range(smallest: int, largest: int, num_classes: int, low: int) -> None:
    """The ``ValueError`` for labels outside ``[low, num_classes)``, naming the bad one."""
    if smallest < low or largest >= num_classes:
        bad = smallest if smallest < low else largest
        raise ValueError(
            f"labels must lie in [{low}, {num_classes - 1}] for num_classes = {num_classes}, "
            f"got {bad}"
        )


def check_values(embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int) -> None:
    """The value checks of a batch whose types and shapes are checked, in one read.

    ``embeddings`` (``Tensor[N, D]``) must be finite and ``labels`` (``int[N]``) lie in
    ``[0, num_classes)``: the same ``ValueError`` as :func:`check_embeddings` and
    :func:`check_labels`, but the three values (all finite, smallest and largest label) come
    back to the host together, one synchronization with a GPU instead of three. Nothing is read
    when :func:`value_checks_enabled` is false.
    """
    if not value_checks_enabled():
        return
    finite = torch.isfinite(embeddings).all()
    if labels.numel() == 0:
        _raise_unless_finite(embeddings, bool(finite))
        return
    smallest, largest = torch.aminmax(labels)
    if labels.device != embeddings.device:  # two devices: a read each
        summary = [int(finite), int(smallest), int(largest)]
    else:
        summary = torch.stack((finite.to(torch.int64), smallest.long(), largest.long())).tolist()
    _raise_unless_finite(embeddings, bool(summary[0]))
    _raise_unless_in_range(summary[1], summary[2], num_classes, 0)


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
