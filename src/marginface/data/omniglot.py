"""Omniglot, the two small background sets: handwritten characters for open-set evaluation.

Source: B. M. Lake, R. Salakhutdinov, J. B. Tenenbaum, "Human-level concept learning through
probabilistic program induction", Science 2015; files from github.com/brendenlake/omniglot
(``python/images_background_small1.zip``, ``..._small2.zip``). Licence: MIT, (c) 2015 Brenden
Lake. Sizes: 105×105 binary PNGs, 20 drawers per character; small1 has 5 alphabets /
136 characters / 2,720 images, small2 5 alphabets / 156 characters / 3,120 images.

Split (open set): train on every image of every character of ``train_set`` (default small1);
evaluate on the characters of the other zip that are *not in training*. A character is
identified by **alphabet and character folder** (``"Greek/character01"``): both zips contain
alphabets of the same name (Greek and Latin, with the same characters and drawers), so those are
"in training" and excluded from the evaluation; with small1 for training the evaluation set is
Japanese (katakana), Sanskrit and Tagalog: 106 characters, 2,120 images. ``num_pairs`` balanced
verification pairs in 10 folds are sampled over it (seeded).

Images are downsized (default 28×28, area averaging) and inverted so that strokes are bright
(1.0) on a dark (0.0) background, like MNIST.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .base import DatasetBundle, ImageSet
from .download import RemoteFile, ensure_files
from .folder import decode_collection
from .imaging import check_image_size
from .pairs import sample_pairs
from .splits import check_limit, limit_indices, relabel

__all__ = ["OMNIGLOT_FILES", "load_omniglot"]

_MIRROR = "https://raw.githubusercontent.com/brendenlake/omniglot/master/python"
OMNIGLOT_FILES = {
    "small1": RemoteFile(
        name="images_background_small1.zip",
        urls=(f"{_MIRROR}/images_background_small1.zip",),
        sha256="f38eb80f801274ac2b4dff5b24289016bfaba4a7d5bb50deebf27104ad6cb8a4",
    ),
    "small2": RemoteFile(
        name="images_background_small2.zip",
        urls=(f"{_MIRROR}/images_background_small2.zip",),
        sha256="3ccaa407515a8778e5d0861875af38b17e418f301ad5bb3b5a6b65d901a41c7f",
    ),
}


def _read_zip(path: Path) -> list[tuple[str, bytes]]:
    """``("<alphabet>/<character>", png bytes)`` for every PNG of a background zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            items = []
            for info in archive.infolist():
                parts = info.filename.split("/")
                if info.is_dir() or len(parts) != 4 or not parts[3].lower().endswith(".png"):
                    continue
                items.append((f"{parts[1]}/{parts[2]}", archive.read(info)))
    except (zipfile.BadZipFile, OSError) as error:
        raise ValueError(f"{path}: not a readable Omniglot zip ({error})") from error
    if not items:
        raise ValueError(f"{path}: no <set>/<alphabet>/<character>/<image>.png entries")
    return sorted(items)


def load_omniglot(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    image_size: int | None = 28,
    seed: int = 0,
    limit: int | None = None,
    train_set: str = "small1",
    num_pairs: int = 6000,
    mirrors: Sequence[str] | None = None,
) -> DatasetBundle:
    """Omniglot small background sets, open-set by character (see the module docstring).

    Args:
        data_dir: folder holding ``omniglot/`` (default: ``$MARGINFACE_DATA``, else the cache).
        download: fetch missing zips from GitHub (sha256-verified). Default: True.
        image_size: output side. Default: 28 (None also means 28).
        seed: seed of the ``limit`` subset and of the pairs.
        limit: cap on training images.
        train_set: ``"small1"`` or ``"small2"``; the other one is evaluated.
        num_pairs: verification pairs sampled over the evaluation set. Default: 6000.
        mirrors: base URLs replacing the download URLs.

    Returns:
        An open-set :class:`DatasetBundle`: images ``float32[N, 1, S, S]``, strokes bright,
        ``class_names`` ``"<alphabet>/<character>"``, ``pairs`` over ``test``.
    """
    if train_set not in OMNIGLOT_FILES:
        raise ValueError(f"train_set must be one of small1, small2; got {train_set!r}")
    image_size = check_image_size(image_size) or 28
    limit = check_limit(limit)
    eval_set = "small2" if train_set == "small1" else "small1"
    files = [OMNIGLOT_FILES[train_set], OMNIGLOT_FILES[eval_set]]
    paths = ensure_files("omniglot", files, data_dir, download=download, mirrors=mirrors)
    train_items = _read_zip(paths[files[0].name])
    train_characters = {character for character, _ in train_items}
    eval_items = [
        item for item in _read_zip(paths[files[1].name]) if item[0] not in train_characters
    ]
    if not eval_items:
        raise ValueError(f"{eval_set} has no characters outside {train_set}")

    def invert(images: np.ndarray) -> np.ndarray:
        return np.float32(1.0) - images

    keep = limit_indices(np.arange(len(train_items)), limit, seed)
    train_images, train_labels, train_names = decode_collection(
        [train_items[i] for i in keep], image_size=image_size, rgb=False, transform=invert
    )
    test_images, test_labels, test_names = decode_collection(
        eval_items, image_size=image_size, rgb=False, transform=invert
    )
    train_labels, train_names = relabel(train_labels, train_names)
    return DatasetBundle(
        name="omniglot",
        train=ImageSet(train_images, train_labels, train_names),
        test=ImageSet(test_images, test_labels, test_names),
        pairs=sample_pairs(test_labels, num_pairs, seed=seed),
        open_set=True,
    )
