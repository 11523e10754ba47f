"""Image decoding and resizing shared by the loaders (Pillow for files, torch for arrays).

Every loader returns ``float32[N, C, H, W]`` in [0, 1]; these helpers do the conversion once,
in one place: decode → optional centre crop → optional resize → channel layout.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_EXTENSIONS",
    "check_image_size",
    "decode_image",
    "resize_images",
    "stack_images",
]

_ORIENTATION = 0x0112
"""The EXIF tag of a photo's orientation (1: upright)."""

IMAGE_EXTENSIONS = (
    ".bmp",
    ".gif",
    ".jpeg",
    ".jpg",
    ".pgm",
    ".png",
    ".ppm",
    ".tif",
    ".tiff",
    ".webp",
)


def check_image_size(image_size: object, *, allow_none: bool = True) -> int | None:
    """``image_size`` as a positive int (or None when allowed); ``TypeError``/``ValueError``."""
    if image_size is None and allow_none:
        return None
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)):
        raise TypeError(f"image_size must be a positive int or None, got {image_size!r}")
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size!r}")
    return int(image_size)


def decode_image(
    source: bytes | str | os.PathLike[str],
    *,
    rgb: bool = False,
    crop: int | None = None,
    size: int | tuple[int, int] | None = None,
) -> np.ndarray:
    """Decode one image file to ``uint8[H, W]`` (grey) or ``uint8[H, W, 3]`` (RGB).

    Args:
        source: the encoded bytes or a path.
        rgb: three channels (else luminance ``L``).
        crop: side of a centred square crop, in pixels of the original image, applied before
            resizing (clipped to the image). None: no crop.
        size: output side (square) or ``(height, width)``; resampled with Pillow's area-averaging
            ``BOX`` filter when shrinking and bilinear when enlarging. A square ``size`` on a
            non-square image first centre-crops it to a square of its shorter side (no
            distortion). None: keep.

    Raises:
        ValueError: the bytes are not an image Pillow can decode (the message names ``source``
            when it is a path).
    """
    from PIL import Image, UnidentifiedImageError

    name = "<bytes>" if isinstance(source, bytes) else str(source)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image = _upright_eight_bit(image).convert("RGB" if rgb else "L")
    except (UnidentifiedImageError, OSError, SyntaxError) as error:
        raise ValueError(f"cannot decode image {name}: {error}") from error
    if crop is not None:
        width, height = image.size
        side_w, side_h = min(crop, width), min(crop, height)
        left, top = (width - side_w) // 2, (height - side_h) // 2
        image = image.crop((left, top, left + side_w, top + side_h))
    if isinstance(size, int) and image.size[0] != image.size[1]:
        width, height = image.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        image = image.crop((left, top, left + side, top + side))
    if size is not None:
        height, width = (size, size) if isinstance(size, int) else size
        shrinking = width <= image.size[0] and height <= image.size[1]
        resample = Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR
        image = image.resize((width, height), resample)
    return np.asarray(image, dtype=np.uint8)


def _upright_eight_bit(image: Any) -> Any:
    """``image`` as a viewer shows it: its EXIF orientation applied (as OpenCV's ``imread``
    does; a phone photo is stored sideways) and 16- or 32-bit integer grey (``I;16``, ``I``)
    scaled to 8 bits, which Pillow's ``convert`` would clip at 255 (a white image)."""
    from PIL import Image, ImageOps

    if image.getexif().get(_ORIENTATION, 1) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I"):
        values = np.asarray(image).astype(np.int64)
        top = 65535 if image.mode.startswith("I;16") or values.max(initial=0) > 255 else 255
        scaled = np.clip(np.round(values * (255.0 / top)), 0, 255).astype(np.uint8)
        image = Image.fromarray(scaled, mode="L")
    return image


def stack_images(decoded: Sequence[np.ndarray]) -> np.ndarray:
    """``uint8[H, W]`` / ``uint8[H, W, 3]`` images of equal shape → ``uint8[N, C, H, W]``."""
    if not decoded:
        raise ValueError("no images to stack")
    array = np.stack(decoded)
    if array.ndim == 3:
        return array[:, None, :, :]
    return np.ascontiguousarray(array.transpose(0, 3, 1, 2))


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """Resize ``float32[N, C, H, W]`` to ``float32[N, C, size, size]`` (antialiased bilinear).

    Uses ``torch.nn.functional.interpolate(..., antialias=True)`` in chunks of 8192 images;
    returns the input unchanged when it already has that size.
    """
    import torch
    import torch.nn.functional as F

    if images.shape[-2:] == (size, size):
        return images
    out = np.empty((*images.shape[:2], size, size), dtype=np.float32)
    for start in range(0, images.shape[0], 8192):
        chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + 8192]))
        resized = F.interpolate(
            chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[start : start + 8192] = resized.clamp_(0.0, 1.0).numpy()
    return out
