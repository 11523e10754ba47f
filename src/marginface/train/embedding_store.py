"""The evaluation embeddings of a run, kept in its folder so that ``plot`` (and ``evaluate``,
``compare``) read them instead of embedding the test set and every ``.bin`` set again.

After every epoch the trainer writes what its evaluation embedded (rank 0):
``RUN/embeddings/test.npz`` (the test set) and ``RUN/embeddings/bin_<set>.npz`` (a ``.bin``
set, as is and flipped), float32. Each file carries its key: a fingerprint of the backbone's
weights (:func:`weights_fingerprint`: every tensor of its ``state_dict``, so exactly the
weights of the checkpoint saved after that evaluation), the epoch, and what the embeddings
depend on besides (flip-averaged or not, the autocast dtype, a fingerprint of the images:
:func:`data_fingerprint`). A reader (:meth:`EmbeddingStore.get_or_compute`) uses a file only
when its key equals the one of the weights it evaluates; a missing, stale or damaged file is
embedded again and rewritten. The device, batch size and memory format are not in the key:
they change the embeddings by float32 rounding only.
"""

from __future__ import annotations

import io
import json
import logging
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._atomic import atomic_write_bytes
from ..inference.fingerprint import data_fingerprint, weights_fingerprint
from .state.layout import EMBEDDINGS_NAME

__all__ = [
    "EmbeddingStore",
    "data_fingerprint",
    "stored_embeddings",
    "weights_fingerprint",
]

logger = logging.getLogger(__name__)


_KEY = "__key__"


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
    pending: list[tuple[str, dict[str, Any], dict[str, np.ndarray]]] = field(
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

    def _key(self, name: str, key: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "weights": self.weights, **key}

    def load(self, name: str, key: dict[str, Any]) -> dict[str, np.ndarray] | None:
        """The arrays stored as ``name`` for these weights and ``key`` (JSON-able values), or
        None when the file is missing, belongs to other weights or another ``key``, or cannot
        be read (each said at INFO, naming the file)."""
        path = self.path(name)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as stored:
                saved = json.loads(str(stored[_KEY]))
                arrays = {k: stored[k] for k in saved.pop("arrays")}
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            logger.info("%s cannot be read (%s): embedding again", path, error)
            return None
        epoch = saved.pop("epoch", None)
        expected = self._key(name, key)
        if saved != expected:
            differ = sorted(k for k in {*saved, *expected} if saved.get(k) != expected.get(k))
            what = "other weights" if "weights" in differ else "a different " + ", ".join(differ)
            logger.info("%s: embeddings of %s (epoch %s): embedding again", path, what, epoch)
            return None
        logger.info("%s: the embeddings of epoch %s, reused", path, epoch)
        return arrays

    def save(self, name: str, key: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Write ``arrays`` (float32) as ``name`` with these weights' ``key``, atomically. A
        file that cannot be written is a WARNING naming it (the embeddings are only kept to
        save time), not an error."""
        saved = {**self._key(name, key), "epoch": self.epoch, "arrays": sorted(arrays)}
        buffer = io.BytesIO()
        np.savez(buffer, **{_KEY: np.asarray(json.dumps(saved))}, **arrays)
        try:
            atomic_write_bytes(self.path(name), buffer.getvalue())
        except OSError as error:
            logger.warning("could not keep the embeddings in %s: %s", self.path(name), error)

    def get_or_compute(
        self,
        name: str,
        key: dict[str, Any],
        compute: Callable[[], dict[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """The stored arrays of ``name`` when they match (:meth:`load`, with ``read``), else
        ``compute()``'s, written (with ``write``)."""
        if self.read:
            found = self.load(name, key)
            if found is not None:
                return found
        arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in compute().items()}
        if self.write and self.defer:
            self.pending.append((name, key, arrays))
        elif self.write:
            self.save(name, key, arrays)
        return arrays

    def flush(self) -> None:
        """Write what a deferring store holds (:meth:`save`)."""
        while self.pending:
            self.save(*self.pending.pop(0))


def stored_embeddings(
    store: EmbeddingStore | None,
    name: str,
    compute: Callable[[], dict[str, np.ndarray]],
    *,
    flip: bool,
    amp_dtype: torch.dtype | None,
    data: tuple[Any, ...],
) -> dict[str, np.ndarray]:
    """``compute()``'s arrays, through ``store`` when there is one
    (:meth:`EmbeddingStore.get_or_compute`), keyed by ``flip``, ``amp_dtype`` and
    :func:`data_fingerprint` ``(*data)`` (the images first)."""
    if store is None:
        return compute()
    key = {"flip": bool(flip), "amp": str(amp_dtype), "data": data_fingerprint(*data)}
    return store.get_or_compute(name, key, compute)
