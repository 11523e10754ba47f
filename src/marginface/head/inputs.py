"""The head's input checks, written once for the plain and the class-sharded paths.

A plain head checks its batch locally (:func:`~marginface._validation.check_embeddings`,
:func:`~marginface._validation.check_labels`). A sharded head checks the types locally, then the
values of every rank's batch in one collective
(:meth:`~marginface.executors.sharding.ClassShard.gather_metadata`), so that a bad batch on one
rank raises the same error on every rank instead of hanging the others.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_embeddings, check_labels, check_values
from ..executors.sharding import ClassShard


def checked_batch(
    embeddings: Tensor, labels: Tensor, embedding_dim: int, num_classes: int
) -> Tensor:
    """Check ``embeddings`` (``Tensor[N, D]``, finite, ``D = embedding_dim``) and ``labels``
    (``Tensor[N]`` in ``[0, num_classes)``) locally; ``TypeError``/``ValueError`` naming the
    argument. The values are read back to the host once (:func:`~marginface._validation.
    check_values`). Returns the labels as ``int64[N]``."""
    check_embeddings(embeddings, embedding_dim, values=False)
    labels = check_labels(labels, embeddings.shape[0], num_classes, values=False)
    check_values(embeddings, labels, num_classes)
    return labels


def step_labels(
    embeddings: Tensor,
    labels: Tensor,
    embedding_dim: int,
    num_classes: int,
    shard: ClassShard | None,
) -> Tensor:
    """The checked labels of a training step: this process's ``int64[N]`` (``shard`` None), or
    the global batch's ``int64[N_global]`` in rank order (sharded; every rank's values checked
    in one collective, which also sets ``shard.counts``).

    Raises:
        TypeError, ValueError: naming the argument and the bad value (sharded: on every rank,
            naming the rank whose batch is bad).
    """
    if shard is None:
        return checked_batch(embeddings, labels, embedding_dim, num_classes)
    if not isinstance(embeddings, Tensor) or not embeddings.is_floating_point():
        check_embeddings(embeddings)  # the TypeError, naming the argument
    if embeddings.dim() != 2:
        raise ValueError(f"embeddings must have shape (N, D), got {tuple(embeddings.shape)}")
    if (
        not isinstance(labels, Tensor)
        or labels.dtype == torch.bool
        or not (labels.dtype.is_signed or labels.dtype == torch.uint8)
        or labels.is_floating_point()
    ):
        check_labels(labels, embeddings.shape[0], num_classes)  # the TypeError
    labels = labels.reshape(-1).to(torch.int64)
    shard.gather_metadata(embeddings, labels, num_classes)  # raises on every rank
    if embeddings.shape[1] != embedding_dim:
        raise ValueError(
            f"embeddings must have D = embedding_dim = {embedding_dim} columns, "
            f"got shape {tuple(embeddings.shape)}"
        )
    return shard.gather_rows(labels)  # (N_global,)
