"""The ORL / AT&T Database of Faces: 40 subjects × 10 grey images, closed set by default.

Source: AT&T Laboratories Cambridge (formerly Olivetti Research Laboratory), distributed as
``att_faces.tar`` (``att_faces/s1..s40/1..10.pgm``). Terms: free for research; the archive's
README asks users to credit the Olivetti Research Laboratory and cite F. Samaria and A. Harter,
"Parameterisation of a stochastic model for human face identification", IEEE WACV 1994.
Sizes: 400 PGMs of 92×112 (W×H), 8-bit grey.

No download: the original site is gone and no mirror with a published checksum is known; put
``att_faces.tar`` (or the extracted ``att_faces/`` folder) in ``<data_dir>/orl/``.

Split: ``split="closed"`` (default) holds out ``test_fraction`` (default 0.3, i.e. 3) of each
subject's 10 images; ``split="open"`` holds out that share of the subjects (see :mod:`.splits`).
``image_size=None`` keeps 112×92 (H×W); an int centre-crops to 92×92 and resizes.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

from .base import DatasetBundle
from .download import RemoteFile, ensure_files
from .folder import decode_collection
from .imaging import check_image_size
from .splits import build_bundle, check_split_options

__all__ = ["ORL_ARCHIVE", "load_orl", "read_tar_images"]

ORL_ARCHIVE = RemoteFile(name="att_faces.tar", aliases=("att_faces.tar.gz", "att_faces"))
_ORL_MEMBER = re.compile(r"(?:^|/)(s\d+)/(\d+)\.pgm$")


def read_tar_images(source: Path, pattern: re.Pattern[str]) -> list[tuple[str, bytes]]:
    """``(identity, bytes)`` for each member of a tar (or file under a folder) whose path matches
    ``pattern`` (group 1 = identity), in path order.

    Raises:
        ValueError: unreadable archive, or no matching member.
    """
    found: list[tuple[str, str, bytes]] = []
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            match = pattern.search(path.relative_to(source.parent).as_posix())
            if match and path.is_file():
                found.append((path.as_posix(), match.group(1), path.read_bytes()))
    else:
        try:
            with tarfile.open(source, "r:*") as archive:
                for member in archive:
                    match = pattern.search(member.name) if member.isfile() else None
                    handle = archive.extractfile(member) if match else None
                    if match and handle is not None:
                        found.append((member.name, match.group(1), handle.read()))
        except (tarfile.TarError, EOFError, OSError) as error:
            raise ValueError(f"{source}: not a readable tar archive ({error})") from error
    if not found:
        raise ValueError(f"{source}: no image matching {pattern.pattern!r}")
    return [(identity, data) for _, identity, data in sorted(found)]


def load_orl(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    image_size: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    split: str = "closed",
    test_fraction: float = 0.3,
    num_pairs: int = 3000,
) -> DatasetBundle:
    """ORL faces (see the module docstring).

    Args:
        data_dir: folder holding ``orl/att_faces.tar`` (default: ``$MARGINFACE_DATA``, else the
            cache).
        download: accepted for a uniform interface; there is no mirror (a missing archive raises
            :class:`.download.DataFilesMissingError` saying where to put it).
        image_size: square side, or None for the native 112×92.
        seed: seed of the split, the limit and the pairs.
        limit: cap on training images.
        split: ``"closed"`` (default) or ``"open"``.
        test_fraction: held-out share. Default: 0.3.
        num_pairs: pairs sampled for ``split="open"``.

    Returns:
        A :class:`DatasetBundle` of ``float32[N, 1, H, W]``, class names ``"s1"``..``"s40"``
        ordered by name.
    """
    return load_face_tar(
        "orl",
        ORL_ARCHIVE,
        _ORL_MEMBER,
        data_dir=data_dir,
        download=download,
        image_size=image_size,
        seed=seed,
        limit=limit,
        split=split,
        test_fraction=test_fraction,
        num_pairs=num_pairs,
    )


def load_face_tar(
    name: str,
    archive: RemoteFile,
    member: re.Pattern[str],
    *,
    data_dir: str | os.PathLike[str] | None,
    download: bool,
    image_size: int | None,
    seed: int,
    limit: int | None,
    split: str,
    test_fraction: float,
    num_pairs: int,
) -> DatasetBundle:
    """A grey face set packed as one tar of ``<identity>/<image>`` (ORL, Extended Yale B).

    Checks the options, finds (or reports missing) ``archive`` under ``data_dir/name``, decodes
    the members matching ``member`` (group 1: the identity) and splits them with
    :func:`.splits.build_bundle`.
    """
    image_size = check_image_size(image_size)
    check_split_options(split, test_fraction, limit)
    paths = ensure_files(name, [archive], data_dir, download=download)
    items = read_tar_images(paths[archive.name], member)
    images, labels, names = decode_collection(items, image_size=image_size, rgb=False)
    return build_bundle(
        name,
        images,
        labels,
        names,
        split=split,
        test_fraction=test_fraction,
        seed=seed,
        limit=limit,
        num_pairs=num_pairs,
    )
