"""Any image collection laid out as ``root/<identity>/<image>``, read with Pillow.

Source / licence: the user's own images. Sizes: whatever the folder holds. Every sub-folder of
``root`` is one identity (sorted by name); every file below it with an image extension
(:data:`.imaging.IMAGE_EXTENSIONS`, case-insensitive; hidden files skipped) is one image of it.
Images are decoded grey (``C`` = 1) or RGB (``C`` = 3), optionally centre-cropped and resized to
``image_size × image_size`` (a non-square image is centre-cropped to a square first); with
``image_size=None`` every image is resized to the first image's size.

Split options (see :mod:`.splits`):

* ``split="closed"`` (default): ``test_fraction`` of each identity's images are held out; train and
  test share labels (closed-set accuracy applies; ``pairs`` is None).
* ``split="open"``: ``test_fraction`` of the identities, with all their images, are held out
  (identity-disjoint); both sides are relabelled and ``num_pairs`` balanced genuine/impostor pairs
  in 10 folds are sampled over the test set.

``min_images_per_identity`` drops identities with fewer images before splitting; ``limit`` caps the
training images.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .base import DatasetBundle
from .imaging import IMAGE_EXTENSIONS, check_image_size, decode_image, stack_images
from .splits import build_bundle, check_split_options

__all__ = ["decode_collection", "list_image_folder", "load_folder"]

ImageSource = bytes | Path


def list_image_folder(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """``(identity, image path)`` for every image under ``root/<identity>/``, sorted.

    Raises:
        ValueError: ``root`` is not a folder, or holds no images in that layout.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"folder dataset root {str(root)!r} does not exist or is not a folder")
    items = []
    for identity in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(identity.rglob("*")):
            relative = path.relative_to(identity).parts
            hidden = any(part.startswith(".") for part in relative)
            if path.is_file() and not hidden and path.suffix.lower() in IMAGE_EXTENSIONS:
                items.append((identity.name, path))
    if not items:
        raise ValueError(
            f"no images found under {str(root)!r}: expected root/<identity>/<image> with one of "
            f"the extensions {', '.join(IMAGE_EXTENSIONS)}"
        )
    return items


def decode_collection(
    items: Sequence[tuple[str, ImageSource]],
    *,
    image_size: int | None,
    rgb: bool,
    crop: int | None = None,
    min_images_per_identity: int = 1,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Decode ``(identity, bytes or path)`` items into ``float32[N, C, H, W]`` in [0, 1].

    Args:
        items: identity name and encoded image (bytes or a path) per image.
        image_size: square output side, or None (the first image's size).
        rgb: 3 channels, else 1.
        crop: centred square crop before resizing (see :func:`.imaging.decode_image`).
        min_images_per_identity: identities with fewer images are dropped.
        transform: applied to the final ``float32`` array (e.g. inversion).

    Returns:
        ``(images, labels int64[N], class_names)``, labels indexing the sorted identity names.
    """
    if isinstance(min_images_per_identity, bool) or not isinstance(min_images_per_identity, int):
        raise TypeError(f"min_images_per_identity must be an int, got {min_images_per_identity!r}")
    if min_images_per_identity < 1:
        raise ValueError(f"min_images_per_identity must be >= 1, got {min_images_per_identity}")
    counts: dict[str, int] = {}
    for identity, _ in items:
        counts[identity] = counts.get(identity, 0) + 1
    kept = [(i, s) for i, s in items if counts[i] >= min_images_per_identity]
    if not kept:
        raise ValueError(
            f"no identity has min_images_per_identity={min_images_per_identity} images "
            f"(largest: {max(counts.values(), default=0)})"
        )
    size: int | tuple[int, int] | None = image_size
    if size is None:
        first = decode_image(kept[0][1], rgb=rgb, crop=crop)
        size = (first.shape[0], first.shape[1])

    def decode(item: tuple[str, ImageSource]) -> np.ndarray:
        return decode_image(item[1], rgb=rgb, crop=crop, size=size)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        decoded = list(pool.map(decode, kept))
    images = stack_images(decoded).astype(np.float32) / np.float32(255.0)
    if transform is not None:
        images = transform(images)
    names = tuple(sorted({identity for identity, _ in kept}))
    index = {name: k for k, name in enumerate(names)}
    labels = np.asarray([index[identity] for identity, _ in kept], dtype=np.int64)
    return images, labels, names


def load_folder(
    *,
    root: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    image_size: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    rgb: bool = False,
    crop: int | None = None,
    split: str = "closed",
    test_fraction: float = 0.3,
    num_pairs: int = 3000,
    min_images_per_identity: int = 1,
) -> DatasetBundle:
    """Load ``root/<identity>/<image>`` (see the module docstring for the options).

    Args:
        root: the collection's folder; ``data_dir`` is accepted as a synonym (the CLI's
            ``--data-dir``). One of them is required.
        download: accepted for a uniform interface; there is nothing to download.
        image_size: square side in pixels, or None (first image's size).
        seed: seed of the split, the limit and the pairs.
        limit: cap on training images.
        rgb: RGB (``C`` = 3) instead of grey (``C`` = 1).
        crop: centred square crop before resizing.
        split: ``"closed"`` or ``"open"``.
        test_fraction: held-out share of each identity's images (closed) or of identities (open).
            Default: 0.3.
        num_pairs: pairs sampled over an open-set test set. Default: 3000.
        min_images_per_identity: drop smaller identities first. Default: 1.

    Returns:
        A :class:`DatasetBundle` named ``"folder"``.
    """
    del download
    image_size = check_image_size(image_size)
    check_split_options(split, test_fraction, limit)
    source = root if root is not None else data_dir
    if source is None:
        raise ValueError("the folder dataset needs root= (or data_dir= / --data-dir)")
    items = list_image_folder(source)
    images, labels, names = decode_collection(
        items,
        image_size=image_size,
        rgb=rgb,
        crop=crop,
        min_images_per_identity=min_images_per_identity,
    )
    return build_bundle(
        "folder",
        images,
        labels,
        names,
        split=split,
        test_fraction=test_fraction,
        seed=seed,
        limit=limit,
        num_pairs=num_pairs,
    )
