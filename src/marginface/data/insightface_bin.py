"""insightface's ``.bin`` verification sets (lfw.bin, cfp_fp.bin, agedb_30.bin, ...), read safely.

A ``.bin`` file is a pickle of ``(bins, issame_list)``: ``bins`` holds ``2·P`` encoded images
(JPEG/PNG bytes, Python-2 ``str`` in the older files, or ``uint8`` NumPy buffers: insightface's
``build_eval_pack.py`` stores each image as the ``uint8[N, 1]`` buffer of ``cv2.imencode``,
pickled with protocol 5) and ``issame_list`` ``P`` booleans, pair ``p`` being images ``2p`` and
``2p + 1``. insightface evaluates them with 10-fold cross-validation over consecutive blocks of
pairs.

These files circulate from many hands and a pickle can run code, so they are read with
:func:`~marginface.data.safe_pickle.restricted_load`: only bytes, bools, ints, lists, tuples and
``bool``/``uint8`` arrays (pickle protocols 2 to 5) are admitted; anything else is refused
before it is looked up.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .base import PairSet
from .imaging import decode_image, stack_images
from .safe_pickle import UnsafePickleError, restricted_load

__all__ = ["VerificationBin", "load_verification_bin"]


@dataclass(frozen=True)
class VerificationBin:
    """A decoded ``.bin`` verification set.

    Attributes:
        images: ``uint8[2P, C, H, W]`` (``C`` = 3 for RGB, 1 for grey).
        same: ``bool[P]``: pair ``p`` (images ``2p``, ``2p+1``) shows one identity.
    """

    images: np.ndarray
    same: np.ndarray

    def pairs(self, num_folds: int = 10) -> PairSet:
        """The pairs as a :class:`PairSet` with insightface's folds: ``num_folds`` consecutive
        blocks, as ``sklearn.model_selection.KFold(num_folds, shuffle=False)`` deals them (the
        first ``P mod num_folds`` blocks hold one pair more)."""
        count = len(self.same)
        index = np.arange(2 * count, dtype=np.int64).reshape(count, 2)
        sizes = np.full(num_folds, count // num_folds, dtype=np.int64)
        sizes[: count % num_folds] += 1
        fold = np.repeat(np.arange(num_folds, dtype=np.int64), sizes)
        return PairSet(index, self.same.astype(bool), fold)


def _as_bytes(item: object, position: int, source: str) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if (
        isinstance(item, np.ndarray)
        and item.dtype == np.uint8
        and (item.ndim == 1 or (item.ndim == 2 and item.shape[1] == 1))
    ):  # cv2.imencode's buffer is (N, 1)
        return item.tobytes()
    raise UnsafePickleError(
        f"{source}: image {position} is a {type(item).__name__}, expected encoded image bytes"
    )


def _check_one_size(
    data: bytes, position: int, first: tuple[int, int] | None, source: str
) -> tuple[int, int]:
    """The stored side of image ``position`` (from its header), checked against the first's:
    a ``.bin``'s images share one size, and a resize would hide a set mixed from sources."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    if first is not None and (width, height) != first:
        raise ValueError(
            f"{source}: image {position} is {width}x{height}, image 0 is {first[0]}x{first[1]}; "
            "a .bin's images share one size (a set mixed from several sources?): re-convert it "
            "with `marginface convert --pairs`"
        )
    return (width, height)


def load_verification_bin(
    path: str | os.PathLike[str], *, image_size: int | None = None, rgb: bool = True
) -> VerificationBin:
    """Read and decode an insightface ``.bin`` verification set.

    Args:
        path: the ``.bin`` file.
        image_size: resize every image to this side (None: keep, 112 for insightface's sets).
        rgb: three channels (default) or luminance.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafePickleError: the pickle names anything beyond plain data (nothing from it runs),
            is malformed, or does not hold ``(bins, issame_list)`` with ``2·len(issame_list)``
            images.
        ValueError: an image cannot be decoded, or its stored size differs from the first
            image's (the message names its position).
    """
    path = Path(path)
    source = str(path)
    content = restricted_load(path)
    if not isinstance(content, (tuple, list)) or len(content) != 2:
        raise UnsafePickleError(f"{source}: expected a pickled (bins, issame_list) pair")
    bins, issame = content
    if not isinstance(bins, (list, tuple)):
        raise UnsafePickleError(f"{source}: bins is a {type(bins).__name__}, expected a list")
    same = np.asarray(issame)
    if same.ndim != 1 or not (same.dtype == bool or np.issubdtype(same.dtype, np.integer)):
        raise UnsafePickleError(f"{source}: issame_list must be a list of booleans")
    if len(bins) != 2 * len(same) or not len(same):
        raise UnsafePickleError(
            f"{source}: {len(bins)} images for {len(same)} pairs; expected 2 per pair"
        )
    decoded = []
    first: tuple[int, int] | None = None
    for position, item in enumerate(bins):
        data = _as_bytes(item, position, source)
        try:
            decoded.append(decode_image(data, rgb=rgb, size=image_size))
        except ValueError:
            raise ValueError(
                f"{source}: image {position} cannot be decoded (damaged bytes, or a format "
                "Pillow does not read); re-convert the set"
            ) from None
        first = _check_one_size(data, position, first, source)
    try:
        images = stack_images(decoded)
    except ValueError as error:
        raise ValueError(
            f"{source}: images of different sizes ({error}); pass image_size"
        ) from None
    return VerificationBin(images, same.astype(bool))
