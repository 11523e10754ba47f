"""Face alignment from five landmarks: a 112×112 crop on the ArcFace template.

What insightface's ``face_align.norm_crop`` does: the similarity transform (rotation, uniform
scale, translation) that maps the five landmarks (left eye, right eye, nose tip, left and right
mouth corners, in image pixels) closest, in least squares, onto the ArcFace template
(:data:`ARCFACE_TEMPLATE`), then ``cv2.warpAffine`` with bilinear interpolation and black
borders. The transform is Umeyama's closed form (S. Umeyama, "Least-squares estimation of
transformation parameters between two point patterns", IEEE TPAMI 13(4), 1991), the estimate
scikit-image's ``SimilarityTransform.estimate`` computes.

The landmarks come from a detector: :mod:`marginface.detect` (MTCNN, SCRFD ONNX, through
:mod:`marginface.data.face_photos`) or the user's own, in insightface's
``*_name_5pts_score.txt`` layout (``name x1 y1 ... x5 y5 score``, space-separated) or a CSV
(``name,x1,y1,...,x5,y5[,score]``, with or without a header).
:func:`align_folder` turns a folder of images plus such a file into a folder of crops (same
relative paths), ready for ``marginface convert``.

OpenCV (``pip install "marginface[align]"``, ``opencv-python-headless``) does the warp and the
image files.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import atomic_write_bytes
from .._validation import check_choice, is_same_or_inside, read_utf8_text

__all__ = [
    "ALIGNMENTS",
    "ARCFACE_TEMPLATE",
    "TEMPLATE_96X112",
    "FolderAlignment",
    "align_folder",
    "arcface_template",
    "check_output_folder",
    "insightface_similarity",
    "insightface_template",
    "norm_crop",
    "read_landmarks",
    "similarity_transform",
]

ALIGNMENTS = ("float64", "insightface")
"""How the similarity is computed: ``"float64"`` (:func:`similarity_transform`, the default of
:func:`norm_crop`) or ``"insightface"`` (:func:`insightface_similarity`: the float32 template
of insightface's ``eval_ijbc.py`` and scikit-image's float32 estimate, to the grey level of its
crops)."""

ARCFACE_TEMPLATE = np.array(
    [
        [38.2946, 51.6963],  # left eye (image left)
        [73.5318, 51.5014],  # right eye
        [56.0252, 71.7366],  # nose tip
        [41.5493, 92.3655],  # left mouth corner
        [70.7299, 92.2041],  # right mouth corner
    ],
    dtype=np.float32,
)
"""The five landmark positions of insightface's 112×112 ArcFace crops, ``float32[5, 2]`` (x, y)
in pixels (insightface's ``arcface_dst``, ``face_align.estimate_norm``'s template)."""

TEMPLATE_96X112 = np.array(
    [
        [30.2946, 51.6963],
        [65.5318, 51.5014],
        [48.0252, 71.7366],
        [33.5493, 92.3655],
        [62.7299, 92.2041],
    ],
    dtype=np.float32,
)
"""The same five landmarks in a 96×112 crop, ``float32[5, 2]`` (x, y) pixels: the table
insightface's ``eval_ijbc.py`` builds its 112×112 template from, 8 pixels added to x in
float32 (:func:`insightface_template`)."""


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise ImportError(
            'face alignment needs OpenCV: pip install "marginface[align]" (opencv-python-headless)'
        ) from None
    return cv2


def arcface_template(image_size: int = 112) -> np.ndarray:
    """The template for a square crop of ``image_size`` pixels, ``float64[5, 2]``.

    As insightface's ``estimate_norm``: a multiple of 112 scales :data:`ARCFACE_TEMPLATE` by
    ``image_size / 112``; a multiple of 128 scales it by ``image_size / 128`` and shifts it
    right by ``8 · image_size / 128`` pixels. Default: 112 (the template itself).
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    template = ARCFACE_TEMPLATE.astype(np.float64)
    if image_size % 112 == 0:
        return template * (image_size / 112.0)
    if image_size % 128 == 0:
        ratio = image_size / 128.0
        return template * ratio + np.array([8.0 * ratio, 0.0])
    raise ValueError(f"image_size must be a multiple of 112 or 128, got {image_size}")


def _check_landmarks(name: str, landmarks: object) -> np.ndarray:
    points = np.asarray(landmarks, dtype=np.float64) if not isinstance(landmarks, str) else None
    if points is None or points.shape != (5, 2):
        shape = getattr(points, "shape", type(landmarks).__name__)
        raise ValueError(f"{name} must be five (x, y) points, shape (5, 2), got {shape}")
    if not np.isfinite(points).all():
        raise ValueError(f"{name} holds a non-finite coordinate (NaN or inf): {points.tolist()}")
    spread = float(np.sqrt(((points - points.mean(axis=0)) ** 2).sum(axis=1).mean()))
    if spread < 1e-3:
        raise ValueError(
            f"{name} are degenerate: the five points coincide (spread {spread:.2g} pixels), "
            f"{points.tolist()}"
        )
    return points


def similarity_transform(landmarks: object, template: object) -> np.ndarray:
    r"""The least-squares similarity ``x ↦ s R x + t`` from ``landmarks`` onto ``template``.

    Minimizes :math:`\sum_i \|y_i - (s R x_i + t)\|^2` over rotations ``R`` (no reflection),
    scales ``s > 0`` and translations ``t`` (Umeyama 1991): with centred points
    ``x'``, ``y'``, the SVD ``U Σ Vᵀ`` of ``Σ_xy = (1/n) Σ y'_i x'_iᵀ`` and
    ``D = diag(1, det(U Vᵀ))``, ``R = U D Vᵀ``, ``s = tr(Σ D) / σ_x²``, ``t = ȳ - s R x̄``.

    Args:
        landmarks: ``[5, 2]`` points (x, y) in the source image, pixels.
        template: ``[5, 2]`` target points (:func:`arcface_template`).

    Returns:
        ``float64[2, 3]``, the matrix ``[s R | t]`` for ``cv2.warpAffine``.

    Raises:
        ValueError: not ``(5, 2)``, a non-finite coordinate, or all points coinciding.
    """
    x = _check_landmarks("landmarks", landmarks)
    y = _check_landmarks("template", template)
    x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - x_mean, y - y_mean  # (5, 2) centred
    covariance = yc.T @ xc / x.shape[0]  # (2, 2)
    u, sigma, vt = np.linalg.svd(covariance)
    d = np.array([1.0, 1.0 if np.linalg.det(u) * np.linalg.det(vt) >= 0 else -1.0])
    rotation = (u * d) @ vt  # U D Vᵀ
    variance = (xc**2).sum() / x.shape[0]
    scale = float((sigma * d).sum() / variance)
    translation = y_mean - scale * rotation @ x_mean
    return np.hstack([scale * rotation, translation[:, None]])


def insightface_template(image_size: int = 112) -> np.ndarray:
    """The template ``alignment="insightface"`` maps the landmarks onto, ``float32[5, 2]``.

    At 112 pixels, insightface's ``eval_ijbc.py`` construction, in float32:
    ``T₁₁₂ = TEMPLATE_96X112 + (8, 0)`` (:data:`TEMPLATE_96X112`); other sizes scale it as
    ``face_align.estimate_norm`` scales its template: ``T₁₁₂ · (size/112)`` for a multiple of
    112, ``T₁₁₂ · (size/128)`` plus ``8·size/128`` in x for a multiple of 128 (float32).
    ``T₁₁₂`` equals :data:`ARCFACE_TEMPLATE` (``estimate_norm``'s ``arcface_dst``) but for the
    right mouth corner's x: ``float32(62.7299) + 8 = 70.72990417`` there,
    ``float32(70.7299) = 70.72989655`` in ``arcface_dst``. Default: 112.

    Raises:
        ValueError: ``image_size`` not a positive multiple of 112 or 128.
    """
    arcface_template(image_size)  # checks image_size
    template = TEMPLATE_96X112.copy()
    template[:, 0] += np.float32(8.0)  # eval_ijbc.py's 112×112 template
    if image_size % 112 == 0:
        return template * np.float32(image_size / 112.0)
    ratio = np.float32(image_size / 128.0)
    scaled = template * ratio
    scaled[:, 0] += np.float32(8.0) * ratio
    return scaled


def insightface_similarity(landmarks: object, image_size: int = 112) -> np.ndarray:
    """The matrix insightface's IJB evaluation (``eval_ijbc.py``) computes, in its arithmetic.

    The template is :func:`insightface_template` (float32: ``eval_ijbc.py``'s 112×112 one,
    scaled as ``face_align.estimate_norm`` scales for other sizes), and float32 landmarks go to
    scikit-image's
    ``SimilarityTransform.estimate`` (Umeyama), which then computes the means, the centred
    points, the covariance ``A = dstᶜᵀ srcᶜ / 5``, its determinant, SVD and rank in float32, and
    the rotation ``U diag(d) Vᵀ`` (``d`` float64; ``U Vᵀ`` in float32 when ``A`` has rank 1),
    the scale ``(S·d) / Σ var(srcᶜ)`` and the translation ``dst̄ - scale·R src̄`` in float64. The
    result differs from :func:`similarity_transform` (float64 throughout) by ~1e-6, which moves
    a pixel of the crop by one grey level in most images. ``face_align.estimate_norm``'s
    template (:data:`ARCFACE_TEMPLATE`) differs from this one by 7.6e-6 pixels in one coordinate,
    which also moves a pixel by one grey level in some crops.

    Args:
        landmarks: ``[5, 2]`` (x, y) pixels in the source image (read as float32).
        image_size: side of the crop, a multiple of 112 or 128. Default: 112.

    Returns:
        ``float64[2, 3]`` for ``cv2.warpAffine``.

    Raises:
        ValueError: malformed or degenerate landmarks (as :func:`similarity_transform`).
    """
    _check_landmarks("landmarks", landmarks)
    dst = insightface_template(image_size)  # float32 (5, 2); checks image_size
    src = np.asarray(landmarks, dtype=np.float32)  # (5, 2)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)  # float32 (2,)
    src_c, dst_c = src - src_mean, dst - dst_mean
    covariance = dst_c.T @ src_c / np.float32(src.shape[0])  # float32 (2, 2)
    d = np.ones(2, dtype=np.float64)
    if np.linalg.det(covariance) < 0:
        d[1] = -1.0
    u, sigma, vt = np.linalg.svd(covariance)  # float32
    rank = np.linalg.matrix_rank(covariance)
    if rank == 0:
        raise ValueError(f"landmarks are degenerate: {src.tolist()}")
    if rank == 1:
        flip = np.linalg.det(u) * np.linalg.det(vt) <= 0
        rotation = (u @ np.diag([1.0, -1.0]) @ vt) if flip else (u @ vt).astype(np.float64)
    else:
        rotation = u @ np.diag(d) @ vt  # float64
    scale = 1.0 / src_c.var(axis=0).sum() * (sigma @ d)
    translation = dst_mean - scale * (rotation @ src_mean)
    return np.hstack([rotation * scale, translation[:, None]]).astype(np.float64)


def norm_crop(
    image: np.ndarray, landmarks: object, image_size: int = 112, *, alignment: str = "float64"
) -> np.ndarray:
    """The aligned crop of a face, as insightface's ``face_align.norm_crop``.

    Args:
        image: ``uint8[H, W, C]`` or ``uint8[H, W]`` (any channel order: it is kept).
        landmarks: ``[5, 2]`` (x, y) pixels: eyes, nose tip, mouth corners (image left first).
        image_size: side of the crop, a multiple of 112 or 128. Default: 112.
        alignment: ``"float64"`` (:func:`similarity_transform`) or ``"insightface"``
            (:func:`insightface_similarity`: insightface's crops to the grey level).
            Default: ``"float64"``.

    Returns:
        ``uint8[image_size, image_size(, C)]``: bilinear, black outside the image.
    """
    check_choice("alignment", alignment, ALIGNMENTS)
    if not isinstance(image, np.ndarray) or image.ndim not in (2, 3) or image.size == 0:
        shape = getattr(image, "shape", type(image).__name__)
        raise ValueError(f"image must be a non-empty (H, W) or (H, W, C) array, got {shape}")
    if alignment == "insightface":
        matrix = insightface_similarity(landmarks, image_size)
    else:
        matrix = similarity_transform(landmarks, arcface_template(image_size))
    return _cv2().warpAffine(image, matrix, (image_size, image_size), borderValue=0.0)


def _parse_landmark_row(fields: list[str], where: str) -> tuple[str, np.ndarray]:
    if len(fields) not in (11, 12):
        raise ValueError(
            f"{where}: expected a name, 10 coordinates and an optional score "
            f"(11 or 12 fields), got {len(fields)}"
        )
    try:
        values = np.array([float(v) for v in fields[1:11]], dtype=np.float64).reshape(5, 2)
    except ValueError:
        raise ValueError(f"{where}: the coordinates must be numbers, got {fields[1:11]}") from None
    return fields[0], values


def read_landmarks(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Five landmarks per image from insightface's ``*_name_5pts_score.txt`` layout
    (``name x1 y1 x2 y2 x3 y3 x4 y4 x5 y5 [score]``, whitespace-separated) or a CSV with those
    columns (commas; a header row whose second field is not a number is skipped).

    Returns:
        ``{name: float64[5, 2]}`` in file order; ``name`` is a path relative to the image folder.

    Raises:
        FileNotFoundError: no file; ValueError: text that is not UTF-8, a malformed line (named
        with its number) or a name listed twice.
    """
    path = Path(path)
    text = read_utf8_text(path, "save the landmarks file as UTF-8")
    comma = path.suffix.lower() == ".csv" or "," in text.split("\n", 1)[0]
    rows = csv.reader(text.splitlines()) if comma else (line.split() for line in text.splitlines())
    landmarks: dict[str, np.ndarray] = {}
    for number, fields in enumerate(rows, start=1):
        fields = [f.strip() for f in fields]
        if not fields or not fields[0] or fields[0].startswith("#"):
            continue
        if number == 1 and comma and len(fields) > 1:
            try:
                float(fields[1])
            except ValueError:
                continue  # a header
        name, points = _parse_landmark_row(fields, f"{path}: line {number}")
        if name in landmarks:
            raise ValueError(f"{path}: line {number}: {name} is listed twice")
        landmarks[name] = points
    if not landmarks:
        raise ValueError(f"{path}: no landmarks (expected lines 'name x1 y1 ... x5 y5 [score]')")
    return landmarks


def check_output_folder(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Refuse an output folder that is, or is inside, the input folder, or holds it: writing
    there could replace the user's photos with their crops.

    Raises:
        ValueError: naming both folders.
    """
    if is_same_or_inside(out, src) or is_same_or_inside(src, out):
        raise ValueError(
            f"the output folder {out} and the image folder {src} must not be, or contain, "
            "each other: the crops would be written among the photos; choose another OUT"
        )


def _relative_name(src: Path, name: str) -> str:
    """``name`` as a path relative to ``src``: an absolute path inside ``src`` is made relative;
    an absolute path elsewhere, or a name climbing out with ``..``, is a ``ValueError`` (its
    crop would be written outside the output folder)."""
    path = Path(name)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(src.resolve())
        except ValueError:
            raise ValueError(
                f"the landmarks name {name}, outside the image folder {src}; name images by "
                "their path relative to it"
            ) from None
    if ".." in path.parts:
        raise ValueError(
            f"the landmarks name {name}, which climbs out of the image folder with '..'; name "
            "images by their path inside it"
        )
    return str(path)


def _check_inside(path: Path, points: np.ndarray) -> None:
    """The landmarks' centre lies inside the image and no point lies farther outside than
    the image's own side (a face half out of frame is fine; a crop of nothing is refused).
    Reads only the image's header (Pillow)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            width, height = image.size
    except (OSError, UnidentifiedImageError, ValueError) as error:
        raise ValueError(f"{path}: not a readable image ({error})") from None
    centre = points.mean(axis=0)
    inside = 0 <= centre[0] <= width and 0 <= centre[1] <= height
    side = max(width, height)
    near = (points >= -side).all() and (points[:, 0] <= width + side).all()
    near = near and (points[:, 1] <= height + side).all()
    if not (inside and near):
        raise ValueError(
            f"{path}: the landmarks {np.round(points, 1).tolist()} lie outside the "
            f"{width}x{height} image; its crop would hold no face (are they for another image, "
            "or in another scale?)"
        )


@dataclass(frozen=True)
class FolderAlignment:
    """What :func:`align_folder` wrote.

    Attributes:
        written: crops written (one per listed image).
        unlisted: images in the source folder without landmarks (not aligned).
        out: the output folder.
    """

    written: int
    unlisted: int
    out: Path


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def align_folder(
    src: str | os.PathLike[str],
    landmarks: str | os.PathLike[str] | dict[str, np.ndarray],
    out: str | os.PathLike[str],
    *,
    image_size: int = 112,
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
    alignment: str = "float64",
) -> FolderAlignment:
    """Align every image the landmarks name: ``src/NAME`` → ``out/NAME`` (same relative path
    and format, so ``src/<identity>/<image>`` stays ready for ``marginface convert``).

    Args:
        src: the image folder.
        landmarks: a landmarks file (:func:`read_landmarks`) or ``{name: [5, 2]}``.
        out: the output folder (created; existing files of the same names are replaced); it
            must not be, be inside, or hold ``src`` (:func:`check_output_folder`).
        image_size: crop side, a multiple of 112 or 128. Default: 112.
        workers: threads decoding, warping and encoding (0: one per CPU, at most 8).
        progress: called with ``(done, total)`` after each image.
        alignment: ``"float64"`` or ``"insightface"`` (:func:`norm_crop`). Default: float64.

    Raises:
        ValueError: ``out`` and ``src`` nest; a name outside ``src`` (absolute elsewhere, or
            with ``..``); a listed image is missing, unreadable, or its landmarks are malformed,
            degenerate or outside it (all checked for every image before anything is written;
            the message names the image); or an image's pixels cannot be decoded (crops
            written before it stay, each whole).
    """
    cv2 = _cv2()
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise FileNotFoundError(f"no image folder at {src}")
    check_output_folder(src, out)
    given = read_landmarks(landmarks) if not isinstance(landmarks, dict) else landmarks
    table = {_relative_name(src, name): points for name, points in given.items()}
    arcface_template(image_size)  # checks image_size before any work
    check_choice("alignment", alignment, ALIGNMENTS)
    missing = [name for name in table if not (src / name).is_file()]
    if missing:
        raise ValueError(
            f"{len(missing)} image(s) named in the landmarks are not in {src}, e.g. {missing[0]}"
        )
    for name, points in table.items():
        try:
            _check_landmarks("landmarks", points)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    for name, points in table.items():  # every image's size, from its header, before writing
        _check_inside(src / name, points)
    listed = {str(Path(name)) for name in table}
    unlisted = sum(
        1
        for path in src.rglob("*")
        if path.suffix.lower() in _IMAGE_SUFFIXES and str(path.relative_to(src)) not in listed
    )

    def align_one(name: str) -> None:
        image = cv2.imread(str(src / name), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise ValueError(f"{src / name}: not a readable image")
        crop = norm_crop(image, table[name], image_size, alignment=alignment)
        target = out / name
        encoded, data = cv2.imencode(target.suffix or ".png", crop)
        if not encoded:
            raise ValueError(f"{target}: OpenCV cannot write the format {target.suffix!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data.tobytes())  # never a half-written crop

    names = list(table)
    threads = workers if workers > 0 else min(8, os.cpu_count() or 1)
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for done, _ in enumerate(pool.map(align_one, names), start=1):
            if progress is not None:
                progress(done, len(names))
    return FolderAlignment(written=len(names), unlisted=unlisted, out=out)
