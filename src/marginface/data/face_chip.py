"""dlib's face chips from MTCNN's five landmarks: the 150×150 crop dlib's face recognition
network (``dlib_face_recognition_resnet_model_v1``) expects.

dlib makes a chip with ``get_face_chip(image, shape, size=150, padding=0.25)``, ``shape`` being
its 5-point shape predictor's output (outer and inner corners of both eyes, and the base of
the nose, under the nose). Restated from dlib 20.0's ``get_face_chip_details``,
``chip_details`` and ``extract_image_chips`` (``dlib/image_transforms/interpolation.h``):

1. **Template.** Five mean-face points ``u`` in a unit face square (:data:`DLIB_5POINT_MEAN_FACE`)
   are placed in the chip frame as ``q = size · (padding + u) / (1 + 2·padding)``: the unit
   square grows by ``padding`` on each side and the whole is scaled to ``size``.
2. **Fit.** ``find_similarity_transform(q → shape)``: Umeyama's least-squares similarity
   (rotation without reflection, uniform scale ``s``, translation) from the chip frame **to the
   image**, i.e. the residual is measured in image pixels.
3. **Rectangle.** The chip becomes a rectangle centred on ``T(size/2, size/2)``, of side
   ``size·s`` (dlib's ``centered_drect``: corners ``size·s - 1`` apart), turned by the angle of
   ``T``.
4. **Sampling.** Chip pixel ``(0, 0)`` is sent to the rectangle's (rotated) top-left corner
   and ``(size - 1, 0)``, ``(0, size - 1)`` to its top-right and bottom-left ones, so chip pixel
   ``c`` (integer coordinates at pixel centres, as OpenCV) samples the image at

       E(c) = T(size/2, size/2) + R · k · (c - (size - 1)/2),   k = (size·s - 1) / (size - 1),

   bilinearly, a pixel whose 2×2 neighbourhood leaves the image being black, and the value
   truncated to an integer. When the rectangle is more than about twice the chip's side (its
   half has a larger area than the chip), dlib first halves the image (``pyramid_down<2>``) as
   often as needed and samples that level; a 250×250 LFW photo never triggers it.

:func:`dlib_chip` does steps 2–4 with the five landmarks of :mod:`marginface.detect` (MTCNN:
eye centres, nose tip, mouth corners), :data:`MTCNN_DLIB_TEMPLATE` (the median position of
those five points in dlib's unit face square over LFW photos) and a weighted fit
(:data:`MTCNN_DLIB_WEIGHTS`: dlib's chip follows the eyes), both from
``benchmarks/fit_dlib_chip_template.py``. It warps with OpenCV (bilinear, rounding to the
nearest integer, edge pixels blended with black), not dlib's sampler: given dlib's own
transform, its chip is dlib's to within one grey level inside the image (0.49 on average:
rounding against truncation). It has no image pyramid: for a face more than about twice the
chip's size (``s > 2``), dlib samples a halved, smoothed image and this samples the full one
(more aliasing). How close the chips and dlib's descriptors of them come on LFW:
``benchmarks/bench_dlib_chip.py`` and docs/benchmarks.md.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import check_int, check_real
from .align import _check_landmarks, _cv2

__all__ = [
    "DLIB_5POINT_MEAN_FACE",
    "MTCNN_DLIB_TEMPLATE",
    "MTCNN_DLIB_WEIGHTS",
    "chip_pixel_map",
    "dlib_chip",
    "dlib_chip_matrix",
    "dlib_chip_template",
    "weighted_similarity",
]

DLIB_5POINT_MEAN_FACE = np.array(
    [
        [0.8595674595992, 0.2134981538014],  # outer corner of the eye on the image's right
        [0.6460604764104, 0.2289674387677],  # its inner corner
        [0.1205750620789, 0.2137274526848],  # outer corner of the eye on the image's left
        [0.3340850613712, 0.2290642403242],  # its inner corner
        [0.4901123135679, 0.6277975316475],  # base of the nose
    ]
)
"""dlib's template for its 5-point shape predictor, ``float64[5, 2]`` (x, y) in the unit face
square, in the predictor's part order (the constants of ``get_face_chip_details``). Not used by
:func:`dlib_chip`; it documents dlib's frame and lets a test compare :func:`chip_pixel_map`
with ``dlib.get_face_chip``."""

MTCNN_DLIB_TEMPLATE = np.array(
    [
        [0.235928, 0.216248],  # left eye centre (image left)
        [0.775094, 0.216077],  # right eye centre
        [0.502138, 0.544257],  # nose tip
        [0.268766, 0.813460],  # left mouth corner
        [0.738899, 0.815487],  # right mouth corner
    ]
)
"""MTCNN's five landmarks (:mod:`marginface.detect`, in its order) in dlib's unit face square,
``float64[5, 2]`` (x, y): the coordinate-wise median, over 646 LFW photos (those of the 300
alphabetically first identities of lfw-deepfunneled, 648, less 2 where dlib found no face), of
MTCNN's landmarks mapped into dlib's chip frame by the transform dlib fits to its own 5-point
shape of the same face (``benchmarks/fit_dlib_chip_template.py`` prints it)."""


MTCNN_DLIB_WEIGHTS = np.array([1.0, 1.0, 0.25, 0.0, 0.0])
"""The weight of each MTCNN landmark in :func:`dlib_chip_matrix`'s least squares, ``float64[5]``
(eyes, nose tip, mouth corners). dlib's template is four eye corners and the nose base, so its
chip follows the eyes; MTCNN's nose tip and mouth corners also move with pose and expression,
away from where they sit in dlib's frame (median absolute deviation 2.6–3.7 chip pixels at
size 150 against 1.0–1.2 for the eye centres). Chosen on the fit set from
``{0, 0.1, 0.25, 0.5, 1}`` for the nose and for the mouth (eyes 1) as the pair placing dlib's
own five points nearest where dlib's chip has them (mean distance;
``benchmarks/fit_dlib_chip_template.py``): 1.5 chip pixels (median) on 498 other LFW photos
against 2.3 with equal weights (``benchmarks/bench_dlib_chip.py``). The mouth corners get no
weight: the chip ignores them."""


def _check_size_padding(size: object, padding: object) -> tuple[int, float]:
    size = check_int("size", size, minimum=2)
    padding = check_real("padding", padding, nonnegative=True)
    return size, padding


def dlib_chip_template(size: int = 150, padding: float = 0.25) -> np.ndarray:
    """:data:`MTCNN_DLIB_TEMPLATE` in dlib's chip frame, ``float64[5, 2]``.

    ``q = size · (padding + u) / (1 + 2·padding)``, as dlib places its own template. A point
    ``q`` of the frame lands on chip pixel ``(size - 1)/2 + (q - size/2)·(size - 1)/(size - 1/s)``
    (``s``: image pixels per chip unit; :func:`chip_pixel_map`), i.e. on ``q - 0.5`` when the
    chip keeps the image's scale, and within 0.3 px of it for any ``s >= 0.5`` at size 150.

    Args:
        size: the chip's side in pixels, ``>= 2``. Default: 150 (dlib's recognition network).
        padding: the margin around the unit face square, in units of its side, ``>= 0``.
            Default: 0.25 (``dlib.get_face_chip``'s).

    Raises:
        TypeError: ``size`` not an int, ``padding`` not a real number.
        ValueError: ``size < 2``, ``padding`` negative or not finite.
    """
    size, padding = _check_size_padding(size, padding)
    return size * (padding + MTCNN_DLIB_TEMPLATE) / (1.0 + 2.0 * padding)


def chip_pixel_map(centre: object, scale: float, angle: float, size: int) -> np.ndarray:
    """The map from a chip's pixels to the image that dlib's ``extract_image_chip`` samples
    for a square ``chip_details`` (rectangle centred on ``centre``, side ``size·scale``, turned
    by ``angle``), ``float64[2, 3]``.

    ``E(c) = centre + R(angle) · k · (c - (size - 1)/2)`` with ``k = (size·scale - 1)/(size - 1)``
    (module docstring, step 4). ``cv2.warpAffine(image, E, (size, size),
    flags=INTER_LINEAR | WARP_INVERSE_MAP)`` samples what dlib samples (no image pyramid).

    Args:
        centre: ``(x, y)``, image pixels: ``T(size/2, size/2)``, the rectangle's centre.
        scale: image pixels per chip unit (``s``), ``> 1/size``.
        angle: radians, the rotation of ``T`` (``atan2`` of its first column).
        size: the chip's side in pixels, ``>= 2``.

    Raises:
        TypeError, ValueError: ``size`` not an int ``>= 2``; ``scale`` or ``angle`` not
            finite, or ``scale <= 1/size`` (a rectangle under one pixel, which dlib would turn
            inside out); ``centre`` not two finite numbers.
    """
    size = check_int("size", size, minimum=2)
    scale = check_real("scale", scale, positive=True)
    angle = check_real("angle", angle)
    point = np.asarray(centre, dtype=np.float64) if not isinstance(centre, str) else None
    if point is None or point.shape != (2,) or not np.isfinite(point).all():
        raise ValueError(f"centre must be two finite numbers (x, y), got {centre!r}")
    if size * scale <= 1.0:
        raise ValueError(
            f"scale must exceed 1/size = {1.0 / size:.3g} (a chip rectangle of at least one "
            f"image pixel), got {scale!r}"
        )
    k = (size * scale - 1.0) / (size - 1.0)
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    linear = k * rotation
    offset = point - linear @ np.full(2, (size - 1) / 2.0)
    return np.hstack([linear, offset[:, None]])


def weighted_similarity(source: object, target: object, weights: object) -> np.ndarray:
    r"""The similarity ``x ↦ s R x + t`` minimizing :math:`\sum_i w_i \|y_i - (s R x_i + t)\|^2`
    from ``source`` (``x``) onto ``target`` (``y``), ``float64[2, 3]`` ``[sR | t]``.

    Umeyama's closed form with weights normalized to sum 1: weighted means ``x̄``, ``ȳ``,
    ``Σ_xy = Σ w_i y'_i x'_iᵀ`` of the centred points, its SVD ``U Σ Vᵀ``,
    ``D = diag(1, det(U Vᵀ))``, ``R = U D Vᵀ``, ``s = tr(Σ D) / Σ w_i |x'_i|²``,
    ``t = ȳ - s R x̄``. Equal weights give
    :func:`marginface.data.align.similarity_transform`.

    Args:
        source, target: ``[5, 2]`` points (x, y).
        weights: ``[5]`` finite, ``>= 0``, not all 0.

    Raises:
        ValueError: malformed or degenerate points; bad ``weights``.
    """
    x = _check_landmarks("source", source)
    y = _check_landmarks("target", target)
    w = _check_weights(weights)
    x_mean, y_mean = w @ x, w @ y
    xc, yc = x - x_mean, y - y_mean
    covariance = (yc * w[:, None]).T @ xc  # (2, 2)
    u, sigma, vt = np.linalg.svd(covariance)
    d = np.array([1.0, 1.0 if np.linalg.det(u) * np.linalg.det(vt) >= 0 else -1.0])
    rotation = (u * d) @ vt
    variance = float(w @ (xc**2).sum(axis=1))
    if variance <= 0.0:
        raise ValueError(f"source points with weight coincide: {x.tolist()}, weights {w.tolist()}")
    scale = float((sigma * d).sum() / variance)
    translation = y_mean - scale * rotation @ x_mean
    return np.hstack([scale * rotation, translation[:, None]])


def _check_weights(weights: object) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64) if not isinstance(weights, str) else None
    if w is None or w.shape != (5,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be five finite numbers >= 0, not all 0, got {weights!r}")
    return w / w.sum()


def dlib_chip_matrix(
    landmarks: object,
    size: int = 150,
    padding: float = 0.25,
    *,
    template: object = None,
    weights: object = None,
) -> np.ndarray:
    """The chip-pixel → image map of the dlib chip for five landmarks, ``float64[2, 3]``.

    dlib's steps 2–4 (module docstring): ``T = [sR | t]``, the least-squares similarity from
    the template (chip frame, ``q``) onto ``landmarks`` (image), residual in image pixels as
    dlib fits, each point weighted (:func:`weighted_similarity`; dlib weighs its five points
    equally, this uses :data:`MTCNN_DLIB_WEIGHTS` for MTCNN's); then :func:`chip_pixel_map`
    with ``centre = T(size/2, size/2)``, ``scale = |s|``, ``angle = atan2(sR[1, 0], sR[0, 0])``.

    Args:
        landmarks: ``[5, 2]`` (x, y) image pixels, MTCNN's order (left eye, right eye, nose
            tip, left and right mouth corners; "left" as seen in the image).
        size: chip side in pixels, ``>= 2``. Default: 150.
        padding: margin around the unit face square, ``>= 0``. Default: 0.25.
        template: ``[5, 2]`` points in the unit face square to use instead of
            :data:`MTCNN_DLIB_TEMPLATE` (e.g. :data:`DLIB_5POINT_MEAN_FACE` with dlib's own 5
            points). Default: ``None``.
        weights: ``[5]`` least-squares weights, ``>= 0``. Default: :data:`MTCNN_DLIB_WEIGHTS`
            with the MTCNN template, equal weights with a ``template`` given.

    Raises:
        TypeError, ValueError: as :func:`dlib_chip_template`; landmarks or template not
            ``(5, 2)``, not finite, or all coinciding; landmarks so close together that the
            chip would cover under one image pixel; bad ``weights``.
    """
    size, padding = _check_size_padding(size, padding)
    unit = MTCNN_DLIB_TEMPLATE if template is None else _check_landmarks("template", template)
    if weights is None:
        weights = MTCNN_DLIB_WEIGHTS if template is None else np.ones(5)
    points = _check_landmarks("landmarks", landmarks)
    frame = size * (padding + unit) / (1.0 + 2.0 * padding)
    transform = weighted_similarity(frame, points, weights)  # chip frame -> image, [sR | t]
    centre = transform[:, :2] @ np.full(2, size / 2.0) + transform[:, 2]
    scale = float(np.hypot(transform[0, 0], transform[1, 0]))
    angle = math.atan2(transform[1, 0], transform[0, 0])
    if size * scale <= 1.0:
        raise ValueError(
            f"landmarks span too few pixels for a chip (scale {scale:.3g} image pixels per "
            f"chip pixel): {points.tolist()}"
        )
    return chip_pixel_map(centre, scale, angle, size)


def dlib_chip(
    image: np.ndarray, landmarks: object, size: int = 150, padding: float = 0.25
) -> np.ndarray:
    """The dlib face chip of the face whose MTCNN landmarks are ``landmarks``.

    ``chip[r, c] = bilinear(image, E(c, r))`` with ``E`` = :func:`dlib_chip_matrix`, by
    ``cv2.warpAffine`` (``WARP_INVERSE_MAP``, black outside the image), as
    :func:`marginface.data.align.norm_crop` warps.

    Args:
        image: ``uint8[H, W, 3]`` (any channel order: it is kept; ``uint8[H, W]`` and other
            channel counts work too). dlib's networks take RGB.
        landmarks: ``[5, 2]`` (x, y) image pixels, MTCNN's order.
        size: chip side in pixels, ``>= 2``. Default: 150 (dlib's recognition network).
        padding: margin around the unit face square, ``>= 0``. Default: 0.25.

    Returns:
        ``uint8[size, size, C]`` (``uint8[size, size]`` for a 2-D image).

    Raises:
        TypeError, ValueError: naming the argument: ``image`` not a non-empty uint8 array of
            2 or 3 dimensions; bad ``landmarks``, ``size`` or ``padding``
            (:func:`dlib_chip_matrix`).
    """
    if not isinstance(image, np.ndarray) or image.ndim not in (2, 3) or 0 in image.shape:
        shape = getattr(image, "shape", type(image).__name__)
        raise ValueError(f"image must be a non-empty (H, W, 3) or (H, W) array, got {shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {image.dtype}")
    matrix = dlib_chip_matrix(landmarks, size, padding)
    cv2 = _cv2()
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    return cv2.warpAffine(image, matrix, (size, size), flags=flags, borderValue=0.0)
