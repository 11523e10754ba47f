"""Photos in, faces out: read any photo, detect its faces, cut them as a model takes them.

:func:`read_photo` decodes one file as ``uint8[H, W, 3]`` RGB (EXIF orientation applied; grey,
CMYK, palette and 16-bit images converted); :func:`detect_photos` runs a detector
(:mod:`marginface.detect`) over files; :func:`align_photos` goes from a folder of photos
(``SRC/<identity>/<image>``) to a folder of aligned crops with the same layout, ready for
``marginface convert``: per photo it keeps the largest face, the most central one, or all of
them, and cuts it with :func:`marginface.data.face_crops.cut_face` (by default
:func:`marginface.data.align.norm_crop`'s 112×112 ArcFace crop on its five landmarks). Photos
with no face, with several faces or that cannot be read are listed in a report file, never
dropped silently.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._atomic import atomic_write_bytes, atomic_write_text
from .._validation import check_choice, check_int
from ..detect import Faces, load_detector
from .align import ALIGNMENTS, _cv2, arcface_template, check_output_folder
from .face_crops import CROP_KINDS, cut_face
from .imaging import IMAGE_EXTENSIONS

__all__ = [
    "FACE_CHOICES",
    "PhotoAlignment",
    "PhotoError",
    "align_photos",
    "detect_photos",
    "list_photos",
    "read_photo",
    "select_faces",
]

FACE_CHOICES = ("largest", "central", "all")
"""Which faces of a photo :func:`align_photos` keeps: the largest box, the box whose centre is
nearest the photo's centre, or every face."""

_CHUNK = 32  # photos decoded, detected and written per round


class PhotoError(ValueError):
    """A photo that cannot be read; the message names the file."""


def read_photo(path: str | os.PathLike[str]) -> np.ndarray:
    """The photo at ``path`` as ``uint8[H, W, 3]`` RGB, upright.

    EXIF orientation is applied; grey, grey+alpha, palette, CMYK and RGBA photos become RGB
    (alpha dropped); 16-bit grey is scaled to 8 bits (``round(v · 255 / 65535)``).

    Raises:
        PhotoError: missing, unreadable or truncated; one line naming the file.
    """
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            image.load()
            if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
                wide = np.asarray(image).astype(np.int64)
                grey = ((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
                return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
            return np.ascontiguousarray(np.asarray(image.convert("RGB")))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise PhotoError(f"{path}: not a readable image ({reason})") from None


def list_photos(src: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """``(path, name)`` of every image below the folder ``src`` (hidden files skipped), or of
    the file ``src`` itself; ``name`` is the path relative to ``src`` (the file's name for a
    file), sorted.

    Raises:
        FileNotFoundError: nothing at ``src``; ValueError: a folder with no image.
    """
    src = Path(src)
    if src.is_file():
        return [(src, src.name)]
    if not src.is_dir():
        raise FileNotFoundError(f"no photo or folder at {src}")
    found = sorted(
        (path, path.relative_to(src).as_posix())
        for path in src.rglob("*")
        if path.suffix.lower() in IMAGE_EXTENSIONS
        and path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(src).parts)
    )
    if not found:
        raise ValueError(f"{src}: no images (extensions {', '.join(IMAGE_EXTENSIONS)})")
    return found


def _read_or_error(path: Path) -> np.ndarray | PhotoError:
    try:
        return read_photo(path)
    except PhotoError as error:
        return error


def detect_photos(
    photos: Sequence[tuple[Path, str]],
    detector: object = "mtcnn",
    *,
    workers: int = 0,
    device: object = None,
    min_face_size: float = 20.0,
) -> Iterator[tuple[str, np.ndarray | None, Faces | PhotoError]]:
    """Detect the faces of each photo, in order.

    Args:
        photos: ``(path, name)`` pairs (:func:`list_photos`).
        detector: ``"mtcnn"``, MTCNN's weights, or a detector object
            (:func:`marginface.detect.choice.load_detector`).
        workers: threads decoding photos (0: one per CPU, at most 8).
        device: where the detector runs. Default: CPU.
        min_face_size: MTCNN's smallest face, pixels. Default: 20.

    Yields:
        ``(name, image, faces)``: ``image`` is the RGB array (None when unreadable) and
        ``faces`` the :class:`~marginface.detect.Faces`, or the :class:`PhotoError`.
    """
    model = load_detector(detector, device=device, min_face_size=min_face_size)  # type: ignore[arg-type]
    threads = workers if workers > 0 else min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for start in range(0, len(photos), _CHUNK):
            chunk = photos[start : start + _CHUNK]
            images = list(pool.map(_read_or_error, [path for path, _ in chunk]))
            readable = [i for i, image in enumerate(images) if isinstance(image, np.ndarray)]
            found = model.detect([images[i] for i in readable]) if readable else []
            by_index = dict(zip(readable, found, strict=True))
            for i, (_, name) in enumerate(chunk):
                image = images[i]
                if isinstance(image, PhotoError):
                    yield name, None, image
                else:
                    yield name, image, by_index[i]


def select_faces(faces: Faces, shape: tuple[int, ...], which: str) -> list[int]:
    """Indices of the faces kept: ``"largest"`` (box area), ``"central"`` (box centre nearest
    the image centre, ``shape`` = ``(H, W, ...)``) or ``"all"`` (best score first)."""
    check_choice("faces", which, FACE_CHOICES)
    if faces.count == 0:
        return []
    if which == "all":
        return list(range(faces.count))
    boxes = faces.boxes.astype(np.float64)
    if which == "largest":
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        return [int(np.argmax(area))]
    centre = np.array([shape[1], shape[0]], dtype=np.float64) / 2
    middle = (boxes[:, :2] + boxes[:, 2:]) / 2
    return [int(np.argmin(((middle - centre) ** 2).sum(axis=1)))]


@dataclass(frozen=True)
class PhotoAlignment:
    """What :func:`align_photos` did.

    Attributes:
        photos: photos read or tried.
        written: crops written.
        no_face, several_faces, unreadable: the photos' names in each case (all in the report;
            a photo with several faces still gives its chosen crop unless ``faces="all"``).
        out: the output folder; report: the report file (written when a list is not empty).
    """

    photos: int
    written: int
    out: Path
    report: Path
    no_face: list[str] = field(default_factory=list)
    several_faces: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def align_photos(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    detector: object = "mtcnn",
    faces: str = "largest",
    image_size: int = 112,
    workers: int = 0,
    device: object = None,
    report: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    min_face_size: float = 20.0,
    alignment: str = "float64",
    suffix: str | None = None,
    crop: str = "arcface",
) -> PhotoAlignment:
    """Detect and align every photo of ``src``: ``src/NAME`` → ``out/NAME`` (same relative path
    and format; with ``faces="all"``, ``out/STEM_K.EXT`` for the K-th face, best score first).

    Args:
        src: a folder of photos (``SRC/<identity>/<image>`` for ``convert``) or one photo.
        out: the output folder (created); must not be, be inside or hold ``src``.
        detector: ``"mtcnn"``, MTCNN's weights or a detector object. Default: ``"mtcnn"``.
        faces: ``"largest"``, ``"central"`` or ``"all"`` (:func:`select_faces`).
        image_size: crop side; for ``crop="arcface"`` a multiple of 112 or 128. Default: 112.
        workers: threads decoding and writing (0: one per CPU, at most 8).
        device: where the detector runs. Default: CPU.
        report: the TSV listing photos with no face, several faces or unreadable
            (``name<TAB>problem<TAB>detail``). Default: ``OUT_report.tsv`` beside ``out``.
        progress: called with ``(done, total)`` after each photo.
        min_face_size: MTCNN's smallest face, pixels. Default: 20.
        alignment: ``"float64"`` or ``"insightface"``
            (:func:`~marginface.data.align.norm_crop`). Default: ``"float64"``.
        suffix: write every crop in this format (e.g. ``".png"``, lossless) instead of the
            photo's own. Default: None (the photo's).
        crop: how the face is cut, one of :data:`~marginface.data.face_crops.CROP_KINDS`
            (:func:`~marginface.data.face_crops.cut_face`; a model's description names its
            own, ``face_crop``). Default: ``"arcface"``.

    Raises:
        ValueError: bad options or folders (named), a detector that cannot be loaded.
    """
    check_choice("faces", faces, FACE_CHOICES)
    check_choice("alignment", alignment, ALIGNMENTS)
    check_choice("crop", crop, CROP_KINDS)
    if crop == "arcface":
        arcface_template(image_size)  # checks image_size before any work
    else:
        check_int("image_size", image_size, minimum=2)
    cv2 = _cv2()
    src, out = Path(src), Path(out)
    photos = list_photos(src)
    check_output_folder(src, out)
    report_path = Path(report) if report is not None else out.with_name(out.name + "_report.tsv")
    root = out.resolve()
    no_face, several, unreadable, lines = [], [], [], []
    written = 0
    threads = workers if workers > 0 else min(8, os.cpu_count() or 1)

    def write(name: str, crop: np.ndarray) -> None:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if root not in target.resolve().parents:
            raise ValueError(f"{name}: the crop would land outside {out} (a link?)")
        ok, encoded = cv2.imencode(target.suffix or ".png", crop[:, :, ::-1])  # RGB -> BGR
        if not ok:
            raise ValueError(f"{target}: OpenCV cannot encode this format")
        atomic_write_bytes(target, encoded.tobytes())

    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = []
        results = detect_photos(
            photos, detector, workers=threads, device=device, min_face_size=min_face_size
        )
        for done, (name, image, found) in enumerate(results, start=1):
            if isinstance(found, PhotoError):
                unreadable.append(name)
                lines.append(f"{name}\tunreadable\t{found}")
            elif found.count == 0:
                no_face.append(name)
                lines.append(f"{name}\tno_face\t")
            else:
                if found.count > 1:
                    several.append(name)
                    lines.append(f"{name}\tseveral_faces\t{found.count} faces, kept {faces}")
                chosen = select_faces(found, image.shape, faces)
                for k in chosen:
                    face = cut_face(
                        image,
                        found.landmarks[k],
                        found.boxes[k],
                        crop=crop,
                        size=image_size,
                        alignment=alignment,
                    )
                    target = name if suffix is None else Path(name).with_suffix(suffix).as_posix()
                    if faces == "all":
                        stem = Path(target)
                        target = stem.with_name(f"{stem.stem}_{k}{stem.suffix}").as_posix()
                    pending.append(pool.submit(write, target, face))
                    while len(pending) > 4 * threads:  # bounded: crops are not all held
                        pending.pop(0).result()
                written += len(chosen)
            if progress is not None:
                progress(done, len(photos))
        for job in pending:
            job.result()
    if lines:
        atomic_write_text(report_path, "name\tproblem\tdetail\n" + "\n".join(lines) + "\n")
    return PhotoAlignment(
        photos=len(photos),
        written=written,
        out=out,
        report=report_path,
        no_face=no_face,
        several_faces=several,
        unreadable=unreadable,
    )
