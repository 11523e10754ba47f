"""Embedding a list of images at once: the loop ``gallery build``/``add`` and ``search`` share.

:func:`embed_paths` gathers :func:`marginface.inference.folder.iter_embeddings`'s batches into
one ``float32[N, D]`` array of unit rows and the names they belong to, with the face each was
cut from when a detector ran; images that cannot be used are returned apart, never fatal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .face_model import FaceModel
from .face_rows import DetectedFace

__all__ = ["EmbeddedPaths", "embed_paths"]


@dataclass
class EmbeddedPaths:
    """What :func:`embed_paths` returns.

    Attributes:
        names: the relative paths embedded, in order (``N`` of them).
        embeddings: ``float32[N, D]``, one unit row per name (``[0, 0]`` when none could be
            used).
        skipped: ``(relative path, reason)`` of each image that could not be used.
        faces: one per name: the :class:`~marginface.inference.face_rows.DetectedFace` (box,
            landmarks, score in pixels of the photo) its crop was cut from, or None for an
            image taken as an aligned crop (always None without a detector).
    """

    names: list[str]
    embeddings: np.ndarray
    skipped: list[tuple[str, str]] = field(default_factory=list)
    faces: list[DetectedFace | None] = field(default_factory=list)


def embed_paths(
    model: FaceModel,
    root: str | os.PathLike[str],
    relative_paths: Sequence[str],
    *,
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> EmbeddedPaths:
    """The unit embeddings ``e_i = f(x_i) / ‖f(x_i)‖`` (flip-tested as ``model`` says) of the
    images ``root / relative_paths[i]``, batched by ``model.batch_size``.

    Args:
        model: the :class:`~marginface.inference.FaceModel` embedding them (its device, batch
            size, flip test and detector).
        root: the folder the paths are relative to.
        relative_paths: the images, POSIX-relative to ``root``.
        workers: decoding threads (0: one per CPU, at most 8). Default: 0.
        progress: called with ``(done, total)`` after each batch. Default: None.

    Returns:
        :class:`EmbeddedPaths`: the names embedded, their ``float32[N, D]`` rows and faces, and
        the images skipped with the reason.

    Raises:
        ValueError: ``workers`` < 0.
    """
    from .folder import iter_face_embeddings

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
    skipped: list[tuple[str, str]] = []
    names: list[str] = []
    rows: list[np.ndarray] = []
    faces: list[DetectedFace | None] = []
    for paths, batch, batch_faces in iter_face_embeddings(
        model,
        Path(root),
        list(relative_paths),
        skipped=skipped,
        workers=workers,
        progress=progress,
    ):
        names += paths
        rows.append(batch)
        faces += batch_faces
    embeddings = np.concatenate(rows) if rows else np.zeros((0, 0), dtype=np.float32)
    return EmbeddedPaths(names, embeddings, skipped, faces)
