"""A detected face cut from its photo the way a model's training faces were cut: one function,
:func:`cut_face`, for every kind a model description names (``ModelDescription.face_crop``,
:data:`marginface.models.description.FACE_CROPS`).

==============  ================================================================================
``arcface``     :func:`~marginface.data.align.norm_crop`: the similarity transform of the five
                landmarks onto insightface's ArcFace template (112×112, scaled to the side)
``dlib-chip``   :func:`~marginface.data.face_chip.dlib_chip`: dlib's face chip (padding 0.25)
                from the same five landmarks (dlib's ResNet v1, 150×150)
``mtcnn-box``   facenet-pytorch's ``extract_face``: the detector's box, grown by ``margin``
                pixels of the output, clipped to the photo and resized to the side with
                OpenCV's area interpolation (its NumPy path); no rotation
==============  ================================================================================
"""

from __future__ import annotations

import numpy as np

from .._validation import check_choice, check_int, check_real
from .align import ALIGNMENTS, _cv2, norm_crop

__all__ = ["CROP_KINDS", "box_crop", "cut_face"]

CROP_KINDS = ("arcface", "dlib-chip", "mtcnn-box")
"""The kinds :func:`cut_face` makes (the same names as ``ModelDescription.face_crop``)."""


def box_crop(image: np.ndarray, box: object, size: int = 160, margin: float = 0.0) -> np.ndarray:
    """facenet-pytorch's face crop: the box ``(x1, y1, x2, y2)`` grown by ``margin`` pixels of
    the output on each axis, i.e. by ``margin·(x2 − x1)/(size − margin)`` image pixels in x (and
    the same in y), half on each side; the corners truncated to integers and clipped to the
    photo; the region resized to ``size×size`` (``cv2.INTER_AREA``).

    Args:
        image: ``uint8[H, W, C]``.
        box: four numbers, image pixels.
        size: output side, ``>= 1``. Default: 160 (facenet-pytorch's InceptionResnetV1).
        margin: output pixels added around the box, ``0 <= margin < size``. Default: 0.

    Returns:
        ``uint8[size, size, C]``.

    Raises:
        ValueError: a bad argument, or a box with no pixel inside the photo (named).
    """
    size = check_int("size", size, minimum=1)
    margin = check_real("margin", margin, nonnegative=True)
    if margin >= size:
        raise ValueError(f"margin must be < size ({size}), got {margin}")
    corners = np.asarray(box, dtype=np.float64).reshape(-1)
    if corners.shape != (4,) or not np.all(np.isfinite(corners)):
        raise ValueError(f"box must be four finite numbers (x1, y1, x2, y2), got {box!r}")
    grow_x = margin * (corners[2] - corners[0]) / (size - margin)
    grow_y = margin * (corners[3] - corners[1]) / (size - margin)
    height, width = image.shape[:2]
    x1 = int(max(corners[0] - grow_x / 2, 0))
    y1 = int(max(corners[1] - grow_y / 2, 0))
    x2 = int(min(corners[2] + grow_x / 2, width))
    y2 = int(min(corners[3] + grow_y / 2, height))
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"box {corners.tolist()} has no pixel inside the {width}x{height} photo")
    return _cv2().resize(image[y1:y2, x1:x2], (size, size), interpolation=_cv2().INTER_AREA)


def cut_face(
    image: np.ndarray,
    landmarks: object,
    box: object = None,
    *,
    crop: str = "arcface",
    size: int = 112,
    alignment: str = "float64",
) -> np.ndarray:
    """The face as a model of ``crop`` kind takes it, ``uint8[size, size, C]``.

    Args:
        image: the photo, ``uint8[H, W, C]``.
        landmarks: the face's five landmarks ``[5, 2]`` (x, y), MTCNN's/insightface's order
            (eyes, nose, mouth corners); used by ``arcface`` and ``dlib-chip``.
        box: the face's box ``(x1, y1, x2, y2)``; used by ``mtcnn-box``.
        crop: one of :data:`CROP_KINDS`. Default: ``"arcface"``.
        size: output side. Default: 112.
        alignment: ``arcface`` only: ``"float64"`` or ``"insightface"``
            (:func:`~marginface.data.align.norm_crop`).

    Raises:
        ValueError: an unknown ``crop``; what the kind's function raises.
    """
    check_choice("crop", crop, CROP_KINDS)
    check_choice("alignment", alignment, ALIGNMENTS)
    if crop == "arcface":
        return norm_crop(image, landmarks, size, alignment=alignment)
    if crop == "dlib-chip":
        from .face_chip import dlib_chip

        return dlib_chip(image, landmarks, size)
    if box is None:
        raise ValueError("crop 'mtcnn-box' needs the face's box")
    return box_crop(image, box, size)
