"""Embedding every image of a folder into one file (``marginface embed``), resumably.

The output holds one row per image: ``paths`` (relative to the folder, POSIX separators),
``identities`` (the first folder level, ``FOLDER/<identity>/<image>``; empty for an image at
the top) and ``embeddings`` (``float32[N, D]``, unit rows), with the model's description.
``.npz`` always; ``.parquet`` when pyarrow is installed (columns ``path``, ``identity``,
``embedding`` as a list of floats; the description in the schema's metadata).

A second run over the same folder skips the images already in the output; the file is
rewritten atomically every ``flush_every`` images and at the end, so a killed run keeps what it
had embedded. Unreadable images, and images that are not aligned crops of the model's input
size, are listed, skipped and counted (:class:`EmbedResult`), never fatal.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .face_model import FaceModel
from .images import pixel_batch

__all__ = [
    "IMAGE_SUFFIXES",
    "EmbedResult",
    "embed_folder",
    "iter_embeddings",
    "list_images",
    "read_embeddings",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm")


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
    "description"}`` (the description as JSON text).

    Raises:
        ValueError: not such a file (named).
    """
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            return _read_parquet(path)
        with np.load(path, allow_pickle=False) as data:
            return {
                "paths": data["paths"],
                "identities": data["identities"],
                "embeddings": data["embeddings"],
                "description": str(data["description"]),
            }
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
    return {
        "paths": np.asarray(table.column("path").to_pylist(), dtype=str),
        "identities": np.asarray(table.column("identity").to_pylist(), dtype=str),
        "embeddings": embeddings.reshape(len(table), -1),
        "description": metadata.get(b"marginface.description", b"{}").decode(),
    }


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pyarrow_parquet
    except ImportError as error:
        raise ImportError(
            "a .parquet output needs pyarrow: pip install pyarrow (or write .npz)"
        ) from error
    return pyarrow_parquet


def _write(
    path: Path, paths: list[str], identities: list[str], rows: np.ndarray, description: str
) -> None:
    from .._atomic import atomic_write, atomic_write_with

    if path.suffix == ".parquet":
        pyarrow_parquet = _pyarrow_parquet()
        import pyarrow

        table = pyarrow.table(
            {
                "path": paths,
                "identity": identities,
                "embedding": [list(map(float, r)) for r in rows],
            }
        ).replace_schema_metadata({"marginface.description": description})
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
    )
    with atomic_write(path) as stream:
        stream.write(buffer.getvalue())


def _decode(root: Path, relative: str, model: FaceModel) -> tuple[str, np.ndarray | str]:
    """``(relative, uint8[C, H, W])``, or ``(relative, reason)`` when it cannot be used."""
    d = model.description
    try:
        pixels = pixel_batch(
            str(root / relative), channels=d.in_channels, size=d.image_size, aligner=model.aligner
        )
    except (ValueError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return relative, reason.replace(str(root / relative), "the image")
    return relative, pixels[0].numpy()


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
            it must have been written with a model of the same embedding size. It is written
            only when an image was embedded: a run that embeds none (every image refused)
            leaves no file, or the earlier one as it was (``result.embedded == 0``).
        workers: threads decoding images (0: one per CPU, at most 8).
        flush_every: rewrite ``out`` (atomically) after this many new images. Default: 2048.
        progress: ``progress(done, total)`` after each batch (the command line's bar).

    Returns:
        :class:`EmbedResult`.

    Raises:
        ValueError: ``folder`` is not a folder or holds no images; ``out`` is not an
            embeddings file or holds another embedding size; an unknown suffix.
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
    rows = np.empty((0, model.embedding_dim), np.float32)
    if out.exists():
        previous = read_embeddings(out)
        rows = np.asarray(previous["embeddings"], np.float32)
        if rows.ndim != 2 or (rows.size and rows.shape[1] != model.embedding_dim):
            raise ValueError(
                f"{out} holds {rows.shape[-1]}-D embeddings, the model makes "
                f"{model.embedding_dim}-D ones: write to another file"
            )
        rows = rows.reshape(-1, model.embedding_dim)
        paths, identities = list(previous["paths"]), list(previous["identities"])
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
        _write(out, paths, identities, rows, description)

    for batch_paths, batch_rows in iter_embeddings(
        model,
        root,
        [p for p, _ in todo],
        skipped=result.skipped,
        workers=workers,
        progress=progress,
    ):
        new_rows.append(batch_rows)
        paths.extend(batch_paths)
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
    ahead of the model; ``progress(done, total)`` after each batch."""
    threads = workers or min(8, os.cpu_count() or 1)
    window = 8 * model.batch_size
    done = 0
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for start in range(0, len(relative_paths), window):
            part = relative_paths[start : start + window]
            decoded = list(pool.map(lambda relative: _decode(root, relative, model), part))
            for batch in _batches(iter(decoded), model.batch_size):
                good = [(p, x) for p, x in batch if not isinstance(x, str)]
                skipped.extend((p, x) for p, x in batch if isinstance(x, str))
                done += len(batch)
                if good:
                    pixels = torch.from_numpy(np.stack([x for _, x in good]))  # (B, C, H, W)
                    yield [p for p, _ in good], model.embed_pixels(pixels).cpu().numpy()
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
