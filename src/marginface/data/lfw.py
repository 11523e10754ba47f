"""LFW, deep-funneled: face verification with the standard 10-fold View 2 protocol.

Source: Labeled Faces in the Wild, University of Massachusetts Amherst
(http://vis-www.cs.umass.edu/lfw/), deep-funneled alignment. Terms: research use; cite
G. B. Huang et al., "Labeled Faces in the Wild", UMass Tech. Report 07-49, 2007, and for the
alignment G. B. Huang, M. Mattar, H. Lee, E. Learned-Miller, "Learning to Align from Scratch",
NIPS 2012. Sizes: 13,233 RGB JPEGs (250×250) of 5,749 people; ``pairs.txt`` (View 2) holds
10 folds × (300 same-person + 300 different-person) pairs; the folds are identity-disjoint.

Files, in ``<data_dir>/lfw/``: ``lfw-deepfunneled.tgz`` (or ``.tar.gz``, or the extracted
``lfw-deepfunneled/`` folder of ``<Name>/<Name>_NNNN.jpg``) and ``pairs.txt``. ``pairs.txt`` can
be downloaded (scikit-learn's figshare mirror, sha256-pinned); the image archive from UMass
(md5-pinned, as torchvision).

Images are centre-cropped (``crop`` pixels square, default 150 of the 250 — the face region of
the deep-funneled images) and resized (default 112×112, the IResNet input; 64 or less for CPU
runs). Decoding 13k JPEGs takes a while, so the decoded ``uint8`` array is cached once per
``(image_size, crop, rgb)`` as
``<cache_dir>/lfw/lfw-deepfunneled_<size>px_crop<crop>_<rgb|grey>.npz`` and rebuilt when the
source archive changes (its size or mtime; for a folder, the folder's own mtime).

Split (``fold`` = k in 0..9): the test set is the images referenced by fold k's 600 pairs and
``pairs`` indexes them (``pairs.fold`` = k); training uses every image of the identities that
appear in *no* pair of fold k (the other folds' identities and all unpaired ones), or, with
``exclude_all_pair_identities=True``, only the identities that appear in no pair at all.
``fold=None``: the test set is the images of all 6,000 pairs with their 10 folds (for the 10-fold
accuracy with thresholds chosen on nine folds), training on the identities in no pair.
"""

from __future__ import annotations

import logging
import os
import re
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._atomic import atomic_write, remove_stale_temporaries
from .base import DatasetBundle, ImageSet, PairSet
from .download import RemoteFile, ensure_files
from .imaging import check_image_size, decode_image, stack_images
from .locations import resolve_cache_dir
from .splits import check_limit, limit_indices, relabel

__all__ = [
    "LFW_ARCHIVE",
    "LFW_PAIRS",
    "LfwPair",
    "load_lfw",
    "load_lfw_images",
    "read_lfw_pairs",
]

logger = logging.getLogger(__name__)

LFW_ARCHIVE = RemoteFile(
    name="lfw-deepfunneled.tgz",
    urls=("http://vis-www.cs.umass.edu/lfw/lfw-deepfunneled.tgz",),
    md5="68331da3eb755a505a502b5aacb3c201",
    aliases=("lfw-deepfunneled.tar.gz", "lfw-deepfunneled"),
)
LFW_PAIRS = RemoteFile(
    name="pairs.txt",
    urls=(
        "https://ndownloader.figshare.com/files/5976006",
        "http://vis-www.cs.umass.edu/lfw/pairs.txt",
    ),
    sha256="ea42330c62c92989f9d7c03237ed5d591365e89b3e649747777b70e692dc1592",
)
_IMAGE_NAME = re.compile(r"(?:^|/)([^/]+)/\1_(\d{4})\.jpg$")


@dataclass(frozen=True)
class LfwPair:
    """One line of ``pairs.txt``: two images ``(name, number)`` and whether they match."""

    first: tuple[str, int]
    second: tuple[str, int]
    same: bool
    fold: int


def read_lfw_pairs(path: str | os.PathLike[str]) -> list[LfwPair]:
    """Parse an LFW pairs file (View 2 ``pairs.txt``, or a smaller one in the same format).

    Format: a header ``<folds> <n>``, then per fold ``n`` lines ``name i j`` (same person) and
    ``n`` lines ``name1 i name2 j`` (different people), fields separated by whitespace.

    Returns:
        ``folds × 2n`` pairs in file order.

    Raises:
        ValueError: not UTF-8, a malformed header or line (the message gives the line
            number), or the wrong number of lines.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(
            f"{path} is not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}): "
            "save the pairs file as UTF-8"
        ) from None
    lines = [line.split() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines or len(lines[0]) != 2 or not all(f.isdigit() for f in lines[0]):
        raise ValueError(f"{path}: the first line must be '<folds> <pairs per half>'")
    num_folds, per_half = int(lines[0][0]), int(lines[0][1])
    expected = num_folds * 2 * per_half
    if len(lines) - 1 != expected:
        raise ValueError(
            f"{path}: header promises {num_folds} folds × 2 × {per_half} = {expected} pairs, "
            f"found {len(lines) - 1} lines"
        )
    pairs = []
    for offset, fields in enumerate(lines[1:]):
        line_number = offset + 2
        fold, position = divmod(offset, 2 * per_half)
        same = position < per_half
        try:
            if same and len(fields) == 3:
                pair = LfwPair((fields[0], int(fields[1])), (fields[0], int(fields[2])), True, fold)
            elif not same and len(fields) == 4:
                pair = LfwPair(
                    (fields[0], int(fields[1])), (fields[2], int(fields[3])), False, fold
                )
            else:
                raise ValueError("wrong number of fields")
        except ValueError as error:
            kind = "'name i j'" if same else "'name1 i name2 j'"
            raise ValueError(
                f"{path}:{line_number}: expected {kind}, got {' '.join(fields)!r} ({error})"
            ) from error
        pairs.append(pair)
    return pairs


def _archive_members(source: Path) -> Iterator[tuple[str, int, bytes]]:
    """``(name, number, jpeg bytes)`` for each ``<Name>/<Name>_NNNN.jpg`` in a tar or folder."""
    if source.is_dir():
        for path in sorted(source.rglob("*.jpg")):
            match = _IMAGE_NAME.search(path.relative_to(source).as_posix())
            if match:
                yield match.group(1), int(match.group(2)), path.read_bytes()
        return
    try:
        with tarfile.open(source, "r:*") as archive:
            for member in archive:
                match = _IMAGE_NAME.search(member.name) if member.isfile() else None
                if match:
                    handle = archive.extractfile(member)
                    if handle is not None:
                        yield match.group(1), int(match.group(2)), handle.read()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ValueError(f"{source}: not a readable LFW tar archive ({error})") from error


def _fingerprint(source: Path) -> str:
    stat = source.stat()
    return f"{source.name}:{stat.st_size}:{stat.st_mtime_ns}"


def load_lfw_images(
    source: str | os.PathLike[str],
    *,
    image_size: int = 112,
    crop: int | None = 150,
    rgb: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    workers: int | None = None,
) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Decode every LFW image once (cached as ``.npz``): ``uint8[N, C, S, S]`` and their keys.

    Args:
        source: the ``lfw-deepfunneled`` tar(.gz) or extracted folder.
        image_size: output side ``S``. Default: 112.
        crop: centred square crop in original pixels before resizing (None: whole 250×250).
        rgb: 3 channels, else grey (``C`` = 1).
        cache_dir: where the ``.npz`` lives (default: :func:`.locations.resolve_cache_dir`).
        workers: decoding threads (default: ``os.cpu_count()``).

    Returns:
        ``(images, keys)``: keys are ``(name, number)``, sorted.
    """
    source = Path(source)
    channels = "rgb" if rgb else "grey"
    crop_tag = "none" if crop is None else str(crop)
    cache = resolve_cache_dir(cache_dir) / "lfw"
    cache_file = cache / f"lfw-deepfunneled_{image_size}px_crop{crop_tag}_{channels}.npz"
    fingerprint = _fingerprint(source)
    if cache_file.exists():
        try:
            with np.load(cache_file, allow_pickle=False) as stored:
                if str(stored["fingerprint"]) == fingerprint:
                    names, numbers = stored["names"], stored["numbers"]
                    keys = [(str(n), int(i)) for n, i in zip(names, numbers, strict=True)]
                    images = stored["images"]
                    side = image_size if image_size else images.shape[-1]
                    expected = (len(keys), 3 if rgb else 1, side, side)
                    if images.dtype == np.uint8 and images.shape == expected:
                        return images, keys
                    raise ValueError(f"images {images.dtype}{list(images.shape)}")
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as error:
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            logger.warning("ignoring damaged LFW cache %s (%s); decoding again", cache_file, reason)
    logger.info("decoding LFW images from %s (cached afterwards in %s)", source, cache_file)

    def decode(item: tuple[str, int, bytes]) -> tuple[str, int, np.ndarray]:
        name, number, data = item
        return name, number, decode_image(data, rgb=rgb, crop=crop, size=image_size)

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        decoded = sorted(pool.map(decode, _archive_members(source)), key=lambda t: t[:2])
    if not decoded:
        raise ValueError(f"{source}: no images named <Name>/<Name>_NNNN.jpg found")
    images = stack_images([d[2] for d in decoded])
    keys = [(d[0], d[1]) for d in decoded]
    remove_stale_temporaries(cache)
    with atomic_write(cache_file) as out:
        np.savez(
            out,
            images=images,
            names=np.asarray([k[0] for k in keys]),
            numbers=np.asarray([k[1] for k in keys], dtype=np.int64),
            fingerprint=np.asarray(fingerprint),
        )
    return images, keys


def _check_fold(fold: object, num_folds: int) -> int | None:
    if fold is None:
        return None
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)):
        raise TypeError(f"fold must be an int in 0..{num_folds - 1} or None, got {fold!r}")
    if not 0 <= fold < num_folds:
        raise ValueError(f"fold must be in 0..{num_folds - 1} or None, got {fold!r}")
    return int(fold)


def load_lfw(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    image_size: int | None = 112,
    seed: int = 0,
    limit: int | None = None,
    fold: int | None = 0,
    exclude_all_pair_identities: bool = False,
    min_images_per_identity: int = 1,
    crop: int | None = 150,
    rgb: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    pairs_file: str | os.PathLike[str] | None = None,
    mirrors: Sequence[str] | None = None,
) -> DatasetBundle:
    """LFW View 2 (see the module docstring for the protocol).

    Args:
        data_dir: folder holding ``lfw/`` (default: ``$MARGINFACE_DATA``, else the cache).
        download: fetch missing files (``pairs.txt`` from figshare, the archive from UMass).
        image_size: output side in pixels. Default: 112 (None also means 112).
        seed: seed of the ``limit`` subset.
        limit: cap on training images (seeded random subset).
        fold: 0..9 (the test fold) or None (all 10 folds as the test set). Default: 0.
        exclude_all_pair_identities: train only on identities that appear in no pair of any
            fold (the same training set for every ``fold``).
        min_images_per_identity: drop training identities with fewer images. Default: 1.
        crop: centred square crop (pixels of the 250×250 original) before resizing.
        rgb: RGB (``C`` = 3) or grey (``C`` = 1). Default: RGB.
        cache_dir: where the decoded ``.npz`` is kept.
        pairs_file: a pairs file to use instead of ``<data_dir>/lfw/pairs.txt``.
        mirrors: base URLs replacing the download URLs.

    Returns:
        An open-set :class:`DatasetBundle`: ``train`` ``float32[N, C, S, S]`` relabelled
        ``0..K-1``; ``test`` the paired images; ``pairs`` over ``test`` with their folds.

    Raises:
        ValueError / TypeError: a bad option (``fold`` outside 0..9, ...), or a pair naming an
            image absent from the archive.
        DataFilesMissingError: the archive or ``pairs.txt`` is missing and cannot be downloaded.
    """
    image_size = check_image_size(image_size) or 112
    limit = check_limit(limit)
    if isinstance(min_images_per_identity, bool) or not isinstance(min_images_per_identity, int):
        raise TypeError(f"min_images_per_identity must be an int, got {min_images_per_identity!r}")
    if min_images_per_identity < 1:
        raise ValueError(f"min_images_per_identity must be >= 1, got {min_images_per_identity}")
    needed = [LFW_ARCHIVE] if pairs_file is not None else [LFW_ARCHIVE, LFW_PAIRS]
    paths = ensure_files("lfw", needed, data_dir, download=download, mirrors=mirrors)
    pairs_path = Path(pairs_file) if pairs_file is not None else paths[LFW_PAIRS.name]
    all_pairs = read_lfw_pairs(pairs_path)
    num_folds = max(p.fold for p in all_pairs) + 1 if all_pairs else 0
    fold = _check_fold(fold, num_folds)

    images, keys = load_lfw_images(
        paths[LFW_ARCHIVE.name], image_size=image_size, crop=crop, rgb=rgb, cache_dir=cache_dir
    )
    row_of = {key: row for row, key in enumerate(keys)}
    names = sorted({name for name, _ in keys})
    name_index = {name: i for i, name in enumerate(names)}
    labels = np.asarray([name_index[name] for name, _ in keys], dtype=np.int64)

    chosen = [p for p in all_pairs if fold is None or p.fold == fold]
    for pair in chosen:
        for key in (pair.first, pair.second):
            if key not in row_of:
                raise ValueError(
                    f"{pairs_path}: pair image {key[0]}_{key[1]:04d}.jpg is not in "
                    f"{paths[LFW_ARCHIVE.name]}"
                )
    test_rows = np.unique([row_of[k] for p in chosen for k in (p.first, p.second)])
    position = {int(row): i for i, row in enumerate(test_rows)}
    pair_set = PairSet(
        index=np.asarray(
            [(position[row_of[p.first]], position[row_of[p.second]]) for p in chosen],
            dtype=np.int64,
        ).reshape(-1, 2),
        same=np.asarray([p.same for p in chosen], dtype=bool),
        fold=np.asarray([p.fold for p in chosen], dtype=np.int64),
    )

    excluded_pairs = all_pairs if (exclude_all_pair_identities or fold is None) else chosen
    excluded = {name_index[k[0]] for p in excluded_pairs for k in (p.first, p.second)}
    counts = np.bincount(labels, minlength=len(names))
    keep = ~np.isin(labels, list(excluded)) & (counts[labels] >= min_images_per_identity)
    train_rows = limit_indices(np.flatnonzero(keep), limit, seed)
    if len(train_rows) == 0:
        raise ValueError("no training images left after excluding the pair identities")

    train_labels, train_names = relabel(labels[train_rows], names)
    test_labels, test_names = relabel(labels[test_rows], names)
    return DatasetBundle(
        name="lfw",
        train=ImageSet(_to_float(images[train_rows]), train_labels, train_names),
        test=ImageSet(_to_float(images[test_rows]), test_labels, test_names),
        pairs=pair_set,
        open_set=True,
    )


def _to_float(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float32) / np.float32(255.0)
