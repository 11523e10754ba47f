"""Images as :class:`~marginface.inference.FaceModel` takes them, turned into the model's
input: file paths, PIL images, NumPy arrays or tensors, one or a list.

Conventions (the usual ones of each library):

* a path (``str``/``os.PathLike``): decoded with Pillow;
* a PIL image: any mode, converted to RGB (or grey for a one-channel model);
* a NumPy array: ``uint8`` pixels as Pillow gives them, ``(H, W, 3)`` RGB or ``(H, W)`` grey,
  or a batch ``(N, H, W, 3)``;
* a tensor: torchvision's ``(3, H, W)`` or ``(N, 3, H, W)``, ``uint8`` in ``[0, 255]`` or
  floating point in ``[0, 1]``.

An image of the model's input size is an aligned crop; any other goes to the ``aligner``
(``FaceModel(..., detector="mtcnn")`` makes one, :class:`~marginface.inference.FaceCutter`),
or is an error naming the ways to cut it. An aligner with a ``cut(photo)`` method (a
:class:`~marginface.inference.FaceCutter`) also says which face it cut:
:func:`face_pixel_batch` returns those faces with the pixels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from .face_rows import DetectedFace

__all__ = ["Aligner", "ImageInput", "face_pixel_batch", "pixel_batch"]

ImageInput = Any
"""One image or a sequence of images (paths, PIL images, arrays, tensors)."""

Aligner = Callable[[np.ndarray], np.ndarray]
"""``aligner(image) -> crop``: an ``uint8[H, W, 3]`` RGB photo of any size to the aligned
``uint8[h, w, 3]`` crop of the model's input size (the face detector's job)."""


def _wrong_size(got: tuple[int, int], size: tuple[int, int], what: str) -> ValueError:
    return ValueError(
        f"{what} is {got[0]}x{got[1]}, the model takes aligned {size[0]}x{size[1]} crops: "
        "for photos, give a detector (FaceModel(..., detector='mtcnn'), --detector mtcnn), or "
        "cut them first with `marginface align --detector mtcnn --for-model MODEL`"
    )


def _as_hwc(item: Any, channels: int, index: int) -> list[np.ndarray]:
    """``item`` as ``uint8[H, W, C]`` images (a batch gives several)."""
    if isinstance(item, str | os.PathLike):
        from ..data.imaging import decode_image

        image = decode_image(item, rgb=channels == 3)
        return [image if image.ndim == 3 else image[:, :, None]]
    if isinstance(item, Tensor):
        tensor = item.detach().cpu()
        if tensor.dim() == 3:
            tensor = tensor[None]
        if tensor.dim() != 4:
            raise ValueError(
                f"images[{index}]: a tensor must be (C, H, W) or (N, C, H, W), "
                f"got shape {tuple(item.shape)}"
            )
        if tensor.dtype.is_floating_point:
            tensor = (tensor.float().clamp(0, 1) * 255).round()
        elif tensor.dtype != torch.uint8:
            raise TypeError(f"images[{index}]: a tensor must be uint8 or float, got {tensor.dtype}")
        return list(tensor.to(torch.uint8).permute(0, 2, 3, 1).numpy())
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8:
            raise TypeError(
                f"images[{index}]: a NumPy image must be uint8 pixels (as Pillow gives them), "
                f"got {item.dtype}"
            )
        if item.ndim == 2:
            return [item[:, :, None]]
        if item.ndim == 3:
            return [item]
        if item.ndim == 4:
            return list(item)
        raise ValueError(
            f"images[{index}]: a NumPy image must be (H, W), (H, W, C) or (N, H, W, C), "
            f"got shape {item.shape}"
        )
    if hasattr(item, "convert") and hasattr(item, "size"):  # a PIL image
        array = np.asarray(item.convert("RGB" if channels == 3 else "L"), dtype=np.uint8)
        return [array if array.ndim == 3 else array[:, :, None]]
    raise TypeError(
        f"images[{index}] must be a path, a PIL image, a NumPy array or a tensor, "
        f"got {type(item).__name__}"
    )


def _channels(image: np.ndarray, channels: int, index: int) -> np.ndarray:
    have = image.shape[2]
    if have == channels:
        return image
    if channels == 1 and have == 3:  # ITU-R 601-2 luma, Pillow's "L"
        luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        return np.round(luma).astype(np.uint8)[:, :, None]
    if channels == 3 and have == 1:
        return np.repeat(image, 3, axis=2)
    raise ValueError(f"images[{index}] has {have} channels, the model takes {channels}")


def pixel_batch(
    images: ImageInput,
    *,
    channels: int,
    size: tuple[int, int],
    aligner: Aligner | None = None,
) -> Tensor:
    """``images`` as ``uint8[N, C, H, W]`` (RGB or grey), each checked to be ``size``.

    Args:
        images: one image or a list or tuple of them (see the module's conventions).
        channels: the model's ``C`` (3: RGB, 1: grey).
        size: the model's ``(H, W)``.
        aligner: called on each image of another size (an RGB ``uint8[H, W, 3]`` photo) to
            give its aligned crop; None: such an image is an error.

    Raises:
        ValueError: no images; an image of another size without ``aligner`` ("FaceModel needs
            aligned 112x112 crops; ..."); a bad shape. TypeError: an unsupported type.
    """
    return face_pixel_batch(images, channels=channels, size=size, aligner=aligner)[0]


def face_pixel_batch(
    images: ImageInput,
    *,
    channels: int,
    size: tuple[int, int],
    aligner: Aligner | None = None,
) -> tuple[Tensor, list[DetectedFace | None]]:
    """:func:`pixel_batch`'s ``uint8[N, C, H, W]`` and, for each of the ``N`` images, the face
    its crop was cut from: the :class:`~marginface.inference.face_rows.DetectedFace` (box,
    landmarks, score in pixels of that photo) when ``aligner`` has a ``cut(photo)`` method
    returning one (:meth:`~marginface.inference.FaceCutter.cut`), else None (an image of the
    input size taken as it is, or an aligner that only returns the crop). Nothing is kept on
    the aligner: safe from several threads when the aligner is.

    Args and Raises: as :func:`pixel_batch`.
    """
    items = list(images) if isinstance(images, list | tuple) else [images]
    if not items:
        raise ValueError("images is empty: give one image or a list of images")
    out: list[np.ndarray] = []
    faces: list[DetectedFace | None] = []
    for index, item in enumerate(items):
        for image in _as_hwc(item, channels, index):
            face = None
            if image.shape[:2] != size:
                if aligner is None:
                    what = str(item) if isinstance(item, str | os.PathLike) else f"images[{index}]"
                    raise _wrong_size(image.shape[:2], size, what)
                photo = _channels(image, 3, index)
                if callable(getattr(aligner, "cut", None)):
                    cut = aligner.cut(photo)  # type: ignore[attr-defined]
                    image, face = np.asarray(cut.crop, dtype=np.uint8), cut.face
                else:
                    image = np.asarray(aligner(photo), dtype=np.uint8)
                if image.shape[:2] != size:
                    raise _wrong_size(
                        image.shape[:2], size, f"the aligner's crop of images[{index}]"
                    )
            out.append(_channels(image, channels, index))
            faces.append(face)
    batch = np.ascontiguousarray(np.stack(out).transpose(0, 3, 1, 2))  # (N, C, H, W)
    return torch.from_numpy(batch), faces
