"""The evaluation embeddings of a run, kept in its folder so that ``plot`` (and ``evaluate``,
``compare``) read them instead of embedding the test set and every ``.bin`` set again.

After every epoch the trainer writes what its evaluation embedded (rank 0):
``RUN/embeddings/test.npz`` (the test set) and ``RUN/embeddings/bin_<set>.npz`` (a ``.bin``
set), each through the one embedding cache
(:mod:`marginface.inference.embedding_cache`: its file format and its key): ``f(x)`` and,
with the flip test, ``f(flip_w(x))``, keyed by a fingerprint of the backbone's weights
(:func:`weights_fingerprint`: every tensor of its ``state_dict``, so exactly the weights of
the checkpoint saved after that evaluation), the dataset's own transform as the
preprocessing, the autocast dtype, the flip test and a fingerprint of the images
(:func:`data_fingerprint`); the epoch is kept beside the key. A reader
(:meth:`EmbeddingStore.get_or_compute`) uses a file only when its key equals the one of the
weights it evaluates; a missing, stale or damaged file is embedded again and rewritten. Files
written before the one cache (their key has other parts) are embedded again once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..inference.embedding_cache import (
    CachedEmbeddings,
    EmbeddingKey,
    precision_name,
    read_embedding_cache,
    write_embedding_cache,
)
from ..inference.fingerprint import data_fingerprint, weights_fingerprint
from .state.layout import EMBEDDINGS_NAME

__all__ = [
    "DATASET_TRANSFORM",
    "EmbeddingStore",
    "data_fingerprint",
    "stored_embeddings",
    "weights_fingerprint",
]

logger = logging.getLogger(__name__)

DATASET_TRANSFORM = {"transform": "dataset"}
"""The preprocessing part of a run's keys: the dataset's own ``model_input`` (its images are
part of the key through :func:`data_fingerprint`)."""


@dataclass
class EmbeddingStore:
    """The embeddings of one model's weights in ``folder`` (``RUN/embeddings``).

    Args:
        folder: where the ``.npz`` files go (created when one is written).
        weights: :func:`weights_fingerprint` of the model.
        epoch: the completed epochs of those weights (written beside them, for a reader).
        read: use matching files (False: the trainer, whose weights just changed).
        write: write what was computed.
        defer: hold what was computed until :meth:`flush` (the trainer: after the checkpoint
            of these weights, so that a full disk is the checkpoint's error, not this one's).
    """

    folder: Path
    weights: str
    epoch: int | None = None
    read: bool = True
    write: bool = True
    defer: bool = False
    pending: list[tuple[str, EmbeddingKey, CachedEmbeddings]] = field(
        default_factory=list, repr=False
    )

    @classmethod
    def for_model(
        cls, run_dir: str | Path, model: nn.Module, *, epoch: int | None = None, **flags: bool
    ) -> EmbeddingStore:
        """The store of ``run_dir`` (its ``embeddings/`` folder) for ``model``'s weights;
        ``flags``: ``read``, ``write``, ``defer``."""
        return cls(Path(run_dir) / EMBEDDINGS_NAME, weights_fingerprint(model), epoch, **flags)

    def path(self, name: str) -> Path:
        """The file of embeddings ``name`` (``test``, ``bin_lfw``...)."""
        return self.folder / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npz")

    def key(
        self, *, flip: bool, amp_dtype: torch.dtype | None, data: tuple[Any, ...]
    ) -> EmbeddingKey:
        """The one cache's key of these weights' embeddings of ``data`` (the images first,
        then labels or pairs: :func:`data_fingerprint`), with ``flip`` and ``amp_dtype``."""
        return EmbeddingKey(
            weights=self.weights,
            preprocessing=DATASET_TRANSFORM,
            precision=precision_name(amp_dtype),
            flip=bool(flip),
            images=data_fingerprint(*data),
        )

    def load(self, name: str, key: EmbeddingKey) -> CachedEmbeddings | None:
        """The embeddings kept as ``name`` under ``key``, or None when the file is missing,
        of another key (INFO) or damaged (a WARNING of this module's logger naming it: the
        command line shows it as one line):
        :func:`~marginface.inference.embedding_cache.read_embedding_cache`."""
        return read_embedding_cache(self.path(name), key, report=logger.warning)

    def save(self, name: str, key: EmbeddingKey, cached: CachedEmbeddings) -> None:
        """Write ``cached`` as ``name`` under ``key`` (the epoch beside it), atomically. A
        file that cannot be written is a WARNING naming it (the embeddings are only kept to
        save time), not an error."""
        try:
            write_embedding_cache(self.path(name), key, cached, notes={"epoch": self.epoch})
        except OSError as error:
            logger.warning("could not keep the embeddings in %s: %s", self.path(name), error)

    def get_or_compute(
        self, name: str, key: EmbeddingKey, compute: Callable[[], CachedEmbeddings]
    ) -> CachedEmbeddings:
        """The kept embeddings of ``name`` when they match (:meth:`load`, with ``read``), else
        ``compute()``'s (float32), written (with ``write``)."""
        if self.read:
            found = self.load(name, key)
            if found is not None:
                return found
        computed = compute()
        cached = CachedEmbeddings(
            computed.embeddings.astype("float32", copy=False),
            None if computed.flipped is None else computed.flipped.astype("float32", copy=False),
        )
        if self.write and self.defer:
            self.pending.append((name, key, cached))
        elif self.write:
            self.save(name, key, cached)
        return cached

    def flush(self) -> None:
        """Write what a deferring store holds (:meth:`save`)."""
        while self.pending:
            self.save(*self.pending.pop(0))


def stored_embeddings(
    store: EmbeddingStore | None,
    name: str,
    compute: Callable[[], CachedEmbeddings],
    *,
    flip: bool,
    amp_dtype: torch.dtype | None,
    data: tuple[Any, ...],
) -> CachedEmbeddings:
    """``compute()``'s embeddings (``f(x)``, and ``f(flip_w(x))`` with ``flip``), through
    ``store`` when there is one (:meth:`EmbeddingStore.get_or_compute`), keyed by
    :meth:`EmbeddingStore.key`."""
    if store is None:
        return compute()
    return store.get_or_compute(name, store.key(flip=flip, amp_dtype=amp_dtype, data=data), compute)
