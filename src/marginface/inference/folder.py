"""Embedding every image of a folder into one file (``marginface embed``), resumably.

The output holds one row per image: ``paths`` (relative to the folder, POSIX separators),
``identities`` (the first folder level, ``FOLDER/<identity>/<image>``; empty for an image at
the top) and ``embeddings`` (``float32[N, D]``, unit rows), with the model's description.
``.npz`` always; ``.parquet`` when pyarrow is installed (columns ``path``, ``identity``,
``embedding`` as a list of floats; the description in the schema's metadata).

With a detector (``FaceModel(..., detector=...)``), the face each row was cut from is kept
too (:mod:`marginface.inference.face_rows`): ``.npz`` arrays ``boxes`` (``float32[N, 4]``,
``x1, y1, x2, y2``), ``landmarks`` (``float32[N, 5, 2]``) and ``scores`` (``float32[N]``),
in pixels of the original photo; ``.parquet`` columns ``box`` (4 floats), ``landmarks``
(five ``[x, y]``) and ``score``. They are written when at least one row of the file was cut
from a detected face; the other rows (aligned crops taken as they are, rows of an earlier run
without detector) are NaN (null in Parquet). A file none of whose rows was detected has none
of them (as before). A resumed run keeps the earlier rows' faces.

The output records the key of its embeddings (:func:`embedding_key`, the one embedding
cache's :class:`~marginface.inference.embedding_cache.EmbeddingKey` without the images: the
weights' content fingerprint, the preprocessing the model's description says, the precision
and the flip test): ``.npz`` array ``key``, Parquet metadata ``marginface.key``, JSON text.
A second run over the same folder skips the images already in the output, when its key is
the model's: a model of other weights or other preprocessing is refused (a ``ValueError``
naming the file and what differs), never mixed into it. A file written before the key was
recorded is resumed when its description's preprocessing is the model's (its weights cannot
be checked: a warning says so). The file is rewritten atomically every ``flush_every`` images
and at the end, so a killed run keeps what it had embedded. Unreadable images, and images
that are not aligned crops of the model's input size, are listed, skipped and counted
(:class:`EmbedResult`), never fatal.
"""

from __future__ import annotations

import io
import json
import os
import warnings
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .embedding_cache import (
    EmbeddingKey,
    key_differences,
    model_fingerprint,
    precision_name,
    preprocessing_of,
)
from .face_model import FaceModel
from .face_rows import FACE_ARRAYS, DetectedFace, face_arrays, faces_from_arrays, has_faces
from .images import face_pixel_batch

__all__ = [
    "IMAGE_SUFFIXES",
    "EmbedResult",
    "embed_folder",
    "embedding_key",
    "iter_embeddings",
    "iter_face_embeddings",
    "list_images",
    "read_embeddings",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm")
_KEY_METADATA = b"marginface.key"


def embedding_key(model: FaceModel) -> EmbeddingKey:
    """The key of ``model``'s embeddings (the images left out: each row names its own):
    :func:`~marginface.inference.embedding_cache.model_fingerprint` of its module, the
    preprocessing its description says
    (:func:`~marginface.inference.embedding_cache.preprocessing_of`), its dtype as the
    precision, its flip test."""
    return EmbeddingKey(
        weights=model_fingerprint(model.module),
        preprocessing=preprocessing_of(model.description),
        precision=precision_name(model.dtype),
        flip=bool(model.flip),
    )


def _check_resume(out: Path, previous: dict[str, np.ndarray | str], key: EmbeddingKey) -> None:
    """Refuse to resume ``out`` with a model of another key (module docstring)."""
    if "key" in previous:
        try:
            stored = json.loads(str(previous["key"]))
        except ValueError:
            stored = {}
        differ = key_differences(stored if isinstance(stored, dict) else {}, key, ignore=["images"])
    else:  # written before the key was recorded: its description's preprocessing, at least
        from ..models.description import ModelDescription

        try:
            written = preprocessing_of(ModelDescription.from_json(str(previous["description"])))
        except (ValueError, TypeError, KeyError):
            written = {}
        wanted = key.as_dict()["preprocessing"]
        differ = [f"preprocessing.{k}" for k in sorted(wanted) if written.get(k) != wanted[k]]
        if not differ:
            warnings.warn(
                f"{out} was written before embed recorded its model's weights: they cannot be "
                "checked; resuming it with this model's",
                stacklevel=3,
            )
    if differ:
        raise ValueError(
            f"{out} holds embeddings of another model or preprocessing ({', '.join(differ)} "
            "differ): write to another file, or delete it to embed anew"
        )


@dataclass
class EmbedResult:
    """What :func:`embed_folder` did.

    Attributes:
        out: the file written.
        embedded: images embedded by this call.
        already: images found in the output already (skipped).
        skipped: ``(relative path, reason)`` of each unreadable or misshapen image.
        total: rows in the output.
    """

    out: Path
    embedded: int = 0
    already: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    total: int = 0


def list_images(folder: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(relative path, identity)`` of every image under ``folder``, sorted; the identity is
    the first folder level (empty for an image directly in ``folder``).

    Raises:
        ValueError: ``folder`` is not a folder.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder of images")
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            relative = path.relative_to(root).as_posix()
            parts = relative.split("/")
            found.append((relative, parts[0] if len(parts) > 1 else ""))
    return found


def read_embeddings(path: str | os.PathLike[str]) -> dict[str, np.ndarray | str]:
    """An output of :func:`embed_folder`: ``{"paths", "identities", "embeddings",
    "description"}`` (the description as JSON text), ``"key"`` (JSON text,
    :func:`embedding_key`) when the file records it, and ``"boxes"`` (``float32[N, 4]``),
    ``"landmarks"`` (``float32[N, 5, 2]``), ``"scores"`` (``float32[N]``) when the file holds
    detected faces (NaN rows for those not detected; see the module).

    Raises:
        ValueError: not such a file (named).
    """
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            return _read_parquet(path)
        with np.load(path, allow_pickle=False) as data:
            read: dict[str, np.ndarray | str] = {
                "paths": data["paths"],
                "identities": data["identities"],
                "embeddings": data["embeddings"],
                "description": str(data["description"]),
            }
            if "key" in data.files:
                read["key"] = str(data["key"])
            if "boxes" in data.files:
                faces = faces_from_arrays(
                    data["boxes"], data["landmarks"], data["scores"], rows=len(read["paths"])
                )
                read.update(face_arrays(faces))
            return read
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "pickle" in reason:  # NumPy's advice to load it unsafely is not for this file
            reason = "not a NumPy .npz archive"
        raise ValueError(
            f"{path} is not an embeddings file written by marginface embed ({reason}); delete "
            "it, or choose another output, to embed anew"
        ) from None


def _read_parquet(path: Path) -> dict[str, np.ndarray | str]:
    pyarrow_parquet = _pyarrow_parquet()
    table = pyarrow_parquet.read_table(str(path))  # ArrowInvalid (a ValueError) when damaged
    metadata = table.schema.metadata or {}
    embeddings = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    read: dict[str, np.ndarray | str] = {
        "paths": np.asarray(table.column("path").to_pylist(), dtype=str),
        "identities": np.asarray(table.column("identity").to_pylist(), dtype=str),
        "embeddings": embeddings.reshape(len(table), -1),
        "description": metadata.get(b"marginface.description", b"{}").decode(),
    }
    if _KEY_METADATA in metadata:
        read["key"] = metadata[_KEY_METADATA].decode()
    if "box" in table.column_names:
        faces = [
            None if box is None else DetectedFace(box, landmarks, score)
            for box, landmarks, score in zip(
                table.column("box").to_pylist(),
                table.column("landmarks").to_pylist(),
                table.column("score").to_pylist(),
                strict=True,
            )
        ]
        read.update(face_arrays(faces))
    return read


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pyarrow_parquet
    except ImportError as error:
        raise ImportError(
            "a .parquet output needs pyarrow: pip install pyarrow (or write .npz)"
        ) from error
    return pyarrow_parquet


def _write(
    path: Path,
    paths: list[str],
    identities: list[str],
    rows: np.ndarray,
    description: str,
    faces: list[DetectedFace | None] | None = None,
    key: str | None = None,
) -> None:
    from .._atomic import atomic_write, atomic_write_with

    detected = faces is not None and has_faces(faces)
    if path.suffix == ".parquet":
        pyarrow_parquet = _pyarrow_parquet()
        import pyarrow

        columns: dict[str, list] = {
            "path": paths,
            "identity": identities,
            "embedding": [list(map(float, r)) for r in rows],
        }
        if detected:
            columns["box"] = [None if f is None else list(map(float, f.box)) for f in faces]
            columns["landmarks"] = [
                None if f is None else [[float(x), float(y)] for x, y in f.landmarks] for f in faces
            ]
            columns["score"] = [None if f is None else float(f.score) for f in faces]
        metadata = {"marginface.description": description}
        if key is not None:
            metadata[_KEY_METADATA.decode()] = key
        table = pyarrow.table(columns).replace_schema_metadata(metadata)
        atomic_write_with(
            path, lambda temporary: pyarrow_parquet.write_table(table, str(temporary))
        )
        return
    buffer = io.BytesIO()
    np.savez(
        buffer,
        paths=np.asarray(paths, dtype=str),
        identities=np.asarray(identities, dtype=str),
        embeddings=rows.astype(np.float32),
        description=np.asarray(description),
        **({} if key is None else {"key": np.asarray(key)}),
        **(face_arrays(faces) if detected else {}),
    )
    with atomic_write(path) as stream:
        stream.write(buffer.getvalue())


def _decode(
    root: Path, relative: str, model: FaceModel
) -> tuple[str, np.ndarray | str, DetectedFace | None]:
    """``(relative, uint8[C, H, W], face or None)``, or ``(relative, reason, None)`` when it
    cannot be used. The face travels with the pixels: nothing is shared between threads."""
    d = model.description
    try:
        pixels, faces = face_pixel_batch(
            str(root / relative), channels=d.in_channels, size=d.image_size, aligner=model.aligner
        )
    except (ValueError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return relative, reason.replace(str(root / relative), "the image"), None
    return relative, pixels[0].numpy(), faces[0]


def embed_folder(
    model: FaceModel,
    folder: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    workers: int = 0,
    flush_every: int = 2048,
    progress: Callable[[int, int], None] | None = None,
) -> EmbedResult:
    """Embed every image under ``folder`` into ``out`` (``.npz`` or ``.parquet``), skipping
    those already there.

    Args:
        model: the :class:`FaceModel`.
        folder: the images, ``FOLDER/<identity>/<image>`` or flat.
        out: the output file; an existing one is resumed (its rows kept, its images skipped);
            it must have been written with a model of the same key (:func:`embedding_key`:
            weights, preprocessing, precision, flip test; see the module). It is written
            only when an image was embedded: a run that embeds none (every image refused)
            leaves no file, or the earlier one as it was (``result.embedded == 0``).
            With a detector, the box, landmarks and score of each row's face are written too
            (``boxes``/``landmarks``/``scores``, or Parquet's ``box``/``landmarks``/``score``;
            NaN rows for images taken as aligned crops; none when no row was detected: see
            the module).
        workers: threads decoding images (0: one per CPU, at most 8).
        flush_every: rewrite ``out`` (atomically) after this many new images. Default: 2048.
        progress: ``progress(done, total)`` after each batch (the command line's bar).

    Returns:
        :class:`EmbedResult`.

    Raises:
        ValueError: ``folder`` is not a folder or holds no images; ``out`` is not an
            embeddings file, holds another embedding size, or was written with another
            model or preprocessing (named); an unknown suffix.
    """
    out = Path(out)
    root = Path(folder)
    if out.suffix not in (".npz", ".parquet"):
        raise ValueError(f"--out must end in .npz or .parquet, got {out.name!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    images = list_images(root)
    if not images:
        raise ValueError(
            f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)}): nothing to embed, nothing "
            "written"
        )
    paths: list[str] = []
    identities: list[str] = []
    faces: list[DetectedFace | None] = []
    rows = np.empty((0, model.embedding_dim), np.float32)
    key = embedding_key(model)
    if out.exists():
        previous = read_embeddings(out)
        rows = np.asarray(previous["embeddings"], np.float32)
        if rows.ndim != 2 or (rows.size and rows.shape[1] != model.embedding_dim):
            raise ValueError(
                f"{out} holds {rows.shape[-1]}-D embeddings, the model makes "
                f"{model.embedding_dim}-D ones: write to another file"
            )
        rows = rows.reshape(-1, model.embedding_dim)
        _check_resume(out, previous, key)
        paths, identities = list(previous["paths"]), list(previous["identities"])
        if "boxes" in previous:
            faces = faces_from_arrays(*(previous[name] for name in FACE_ARRAYS), rows=len(paths))
        else:
            faces = [None] * len(paths)
    done = set(paths)
    todo = [(p, i) for p, i in images if p not in done]
    result = EmbedResult(out, already=len(images) - len(todo))
    description = model.description.to_json()
    identity_of = dict(todo)
    new_rows: list[np.ndarray] = []
    since_flush = 0

    def flush() -> None:
        nonlocal rows, new_rows
        if new_rows:
            rows = np.concatenate([rows, *new_rows])
            new_rows = []
        _write(out, paths, identities, rows, description, faces, key.to_json())

    for batch_paths, batch_rows, batch_faces in iter_face_embeddings(
        model,
        root,
        [p for p, _ in todo],
        skipped=result.skipped,
        workers=workers,
        progress=progress,
    ):
        new_rows.append(batch_rows)
        paths.extend(batch_paths)
        faces.extend(batch_faces)
        identities.extend(identity_of[p] for p in batch_paths)
        result.embedded += len(batch_paths)
        since_flush += len(batch_paths)
        if since_flush >= flush_every:
            flush()
            since_flush = 0
    if result.embedded:  # nothing embedded: no file written (an existing one is left as is)
        flush()
    result.total = len(paths)
    return result


def iter_embeddings(
    model: FaceModel,
    root: Path,
    relative_paths: list[str],
    *,
    skipped: list[tuple[str, str]],
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[list[str], np.ndarray]]:
    """``(paths, float32[B, D])`` batch after batch for the images ``root / relative_path``;
    an image that cannot be used is appended to ``skipped`` as ``(path, reason)`` instead.
    ``workers`` threads decode (0: one per CPU, at most 8), at most ``8 * batch_size`` images
    ahead of the model; ``progress(done, total)`` after each batch
    (:func:`iter_face_embeddings` without the faces)."""
    for paths, rows, _ in iter_face_embeddings(
        model, root, relative_paths, skipped=skipped, workers=workers, progress=progress
    ):
        yield paths, rows


def iter_face_embeddings(
    model: FaceModel,
    root: Path,
    relative_paths: list[str],
    *,
    skipped: list[tuple[str, str]],
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[list[str], np.ndarray, list[DetectedFace | None]]]:
    """:func:`iter_embeddings`'s ``(paths, float32[B, D])`` batches with, for each row, the
    face its crop was cut from (:class:`~marginface.inference.face_rows.DetectedFace`: box,
    landmarks, score in pixels of that photo), or None for an image taken as it is (an
    aligned crop, or an aligner without ``cut``). Each decoding thread returns the face with
    its pixels, so rows and faces stay paired whatever the order threads finish in."""
    threads = workers or min(8, os.cpu_count() or 1)
    window = 8 * model.batch_size
    done = 0
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for start in range(0, len(relative_paths), window):
            part = relative_paths[start : start + window]
            decoded = list(pool.map(lambda relative: _decode(root, relative, model), part))
            for batch in _batches(iter(decoded), model.batch_size):
                good = [(p, x, f) for p, x, f in batch if not isinstance(x, str)]
                skipped.extend((p, x) for p, x, _ in batch if isinstance(x, str))
                done += len(batch)
                if good:
                    pixels = torch.from_numpy(np.stack([x for _, x, _ in good]))  # (B, C, H, W)
                    rows = model.embed_pixels(pixels).cpu().numpy()
                    yield [p for p, _, _ in good], rows, [f for _, _, f in good]
                if progress is not None:
                    progress(done, len(relative_paths))


def _batches(items: Iterator, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
