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

import contextlib
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._atomic import DiskFullError, atomic_write_bytes, atomic_write_text
from .._model_thread import on_model_thread
from .._validation import check_choice, check_int
from ..detect import Faces, load_detector
from .align import ALIGNMENTS, _cv2, arcface_template, check_output_folder
from .face_crops import CROP_KINDS, cut_face
from .imaging import IMAGE_EXTENSIONS

__all__ = [
    "DEFAULT_FACES",
    "FACE_CHOICES",
    "REPORT_SUFFIX",
    "PhotoAlignment",
    "PhotoError",
    "StagedFolder",
    "align_photos",
    "default_report_path",
    "detect_photos",
    "list_photos",
    "read_photo",
    "select_faces",
    "staged_output",
    "subject_scores",
]

FACE_CHOICES = ("subject", "largest", "central", "all")
"""Which faces of a photo :func:`align_photos` keeps: the subject (whole, large and central,
:func:`subject_scores`), the largest box, the box whose centre is nearest the photo's centre,
or every face."""

DEFAULT_FACES = "subject"
"""The photo commands' default face choice (measured on LFW, docs/detection.md)."""

_CHUNK = 32  # photos decoded, detected and written per round
_CHUNK_PIXELS = 64_000_000  # ... and at most this many pixels (192 MB of RGB) per round


class PhotoError(ValueError):
    """A photo that cannot be read; the message names the file."""


REPORT_SUFFIX = ".report.tsv"
"""The photo commands' report of photos with no face or unreadable: ``OUT.report.tsv`` beside
``OUT`` (``detect``, ``align``, ``convert`` with or without ``--pairs``); ``align`` and
``convert``'s folders used to write ``OUT_report.tsv``. :func:`default_report_path` is the rule."""


def default_report_path(out: str | Path) -> Path:
    """Where a photo command's report goes by default: ``OUT`` + :data:`REPORT_SUFFIX`, beside
    ``out`` (``aligned`` -> ``aligned.report.tsv``, ``faces.jsonl`` ->
    ``faces.jsonl.report.tsv``, ``lfw.bin`` -> ``lfw.bin.report.tsv``)."""
    out = Path(out)
    return out.with_name(out.name + REPORT_SUFFIX)


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
        for chunk in _chunks(photos, pool):
            images = list(pool.map(_read_or_error, [path for path, _ in chunk]))
            readable = [i for i, image in enumerate(images) if isinstance(image, np.ndarray)]
            # on the model thread from the main thread: marginface._model_thread says why
            found = on_model_thread(model.detect, [images[i] for i in readable]) if readable else []
            by_index = dict(zip(readable, found, strict=True))
            for i, (_, name) in enumerate(chunk):
                image = images[i]
                if isinstance(image, PhotoError):
                    yield name, None, image
                else:
                    yield name, image, by_index[i]


def _pixels(path: Path) -> int:
    """``W * H`` from the file's header (no decoding); 0 when it cannot be read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return int(image.size[0]) * int(image.size[1])
    except Exception:  # read_photo names the problem when it decodes the file
        return 0


def _chunks(
    photos: Sequence[tuple[Path, str]], pool: ThreadPoolExecutor
) -> Iterator[Sequence[tuple[Path, str]]]:
    """Rounds of at most :data:`_CHUNK` photos and :data:`_CHUNK_PIXELS` pixels (one photo
    above that goes alone): a folder of 48-megapixel photos is never held 32 at a time."""
    for start in range(0, len(photos), _CHUNK):
        group = photos[start : start + _CHUNK]
        sizes = list(pool.map(_pixels, [path for path, _ in group]))
        first, total = 0, 0
        for i, pixels in enumerate(sizes):
            if i > first and total + pixels > _CHUNK_PIXELS:
                yield group[first:i]
                first, total = i, 0
            total += pixels
        yield group[first:]


def subject_scores(faces: Faces, shape: tuple[int, ...]) -> np.ndarray:
    """``float64[K]``: how much each face looks like the photo's subject (the ``"subject"``
    rule of :func:`select_faces`), in ``[0, 1]``.

    With each box ``(x1, y1, x2, y2)`` clipped to the ``W x H`` frame (``shape`` =
    ``(H, W, ...)``):

    * ``inside = area(clipped) / area(box)``: the share of the face inside the frame
      (1 for a whole face, about 0.7 for one cut off at the edge);
    * ``size = sqrt(area(clipped)) / max_j sqrt(area(clipped_j))``: its visible side,
      relative to the largest visible face of the photo;
    * ``centre = 1 - d / (diag / 2)``: ``d`` the distance of the clipped box's centre from the
      frame's centre, ``diag`` the frame's diagonal;

    ``score = size * inside * centre``. A whole, large face near the middle scores near 1; a
    larger face cut off at the frame's edge loses to a whole one in the middle.
    """
    boxes = faces.boxes.astype(np.float64).reshape(-1, 4)
    height, width = float(shape[0]), float(shape[1])
    area = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
    clipped = np.stack(
        [
            np.clip(boxes[:, 0], 0, width),
            np.clip(boxes[:, 1], 0, height),
            np.clip(boxes[:, 2], 0, width),
            np.clip(boxes[:, 3], 0, height),
        ],
        axis=1,
    )
    visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    inside = np.where(area > 0, visible / np.maximum(area, 1e-12), 0.0)
    side = np.sqrt(visible)
    size = side / side.max() if side.max() > 0 else np.zeros_like(side)
    middle = (clipped[:, :2] + clipped[:, 2:]) / 2
    distance = np.hypot(middle[:, 0] - width / 2, middle[:, 1] - height / 2)
    centre = np.clip(1 - distance / (np.hypot(width, height) / 2), 0, 1)
    return size * inside * centre


def select_faces(faces: Faces, shape: tuple[int, ...], which: str) -> list[int]:
    """Indices of the faces kept, ``shape`` = ``(H, W, ...)`` the photo's:

    * ``"subject"`` (the default of the photo commands): the face a person would pick in a
      photo of one subject, whole, large and central (:func:`subject_scores`; measured on
      LFW's photos with several faces, docs/detection.md);
    * ``"largest"``: the largest box area;
    * ``"central"``: the box centre nearest the image centre;
    * ``"all"``: every face, best score first.

    Ties go to the first (best-scored) face.
    """
    check_choice("faces", which, FACE_CHOICES)
    if faces.count == 0:
        return []
    if which == "all":
        return list(range(faces.count))
    if which == "subject":
        return [int(np.argmax(subject_scores(faces, shape)))]
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
        written: crops written (0: nothing was written, ``out`` was left as it was).
        no_face, several_faces, unreadable: the photos' names in each case (all in the report;
            a photo with several faces still gives its chosen crop unless ``faces="all"``).
        unlisted: with ``faces_from``, the photos of ``src`` it names no face for (``detect``
            found none, or did not see them); in the report too.
        out: the output folder; report: the report file (written when a list is not empty,
            removed otherwise, so no report of an earlier run remains).
    """

    photos: int
    written: int
    out: Path
    report: Path
    no_face: list[str] = field(default_factory=list)
    several_faces: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)


def _listed_faces(
    photos: Sequence[tuple[Path, str]], table: dict[str, Faces], workers: int
) -> Iterator[tuple[str, np.ndarray | None, Faces | PhotoError | None]]:
    """:func:`detect_photos`'s yield for faces already found (``table``, by name): photos it
    does not name give ``(name, None, None)`` and are not read."""
    threads = workers if workers > 0 else min(8, os.cpu_count() or 1)
    listed = [(path, name) for path, name in photos if name in table]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        images: dict[str, np.ndarray | PhotoError] = {}
        chunks = iter(_chunks(listed, pool))
        for _path, name in photos:
            if name not in table:
                yield name, None, None
                continue
            if name not in images:
                images.clear()
                chunk = next(chunks)
                read = pool.map(_read_or_error, [p for p, _ in chunk])
                images.update(zip([n for _, n in chunk], read, strict=True))
            image = images.pop(name)
            if isinstance(image, PhotoError):
                yield name, None, image
            else:
                yield name, image, table[name]


def _prepare_output(out: Path, overwrite: bool) -> Path:
    """A fresh staging folder beside ``out``; ``out`` holding files is refused unless
    ``overwrite``."""
    import tempfile

    if out.exists() and not out.is_dir():
        raise ValueError(f"the output folder {out} is a file: choose a folder for the crops")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(
            f"the output folder {out} holds files already (an earlier align?): choose another "
            "OUT, or pass --overwrite to replace its contents"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.aligning-"))


@dataclass
class StagedFolder:
    """The folder :func:`staged_output` yields: write into ``path``; ``discard = True`` drops
    it instead of publishing it."""

    path: Path
    discard: bool = False


@contextlib.contextmanager
def staged_output(out: str | os.PathLike[str], overwrite: bool = False) -> Iterator[StagedFolder]:
    """A staging folder beside ``out`` to write crops into: it becomes ``out`` when the block
    ends normally (the earlier ``out``, if any, replaced: ``overwrite``), and is removed when
    the block raises or sets ``discard`` (``out`` left as it was). ``out`` holding files
    without ``overwrite`` is a ``ValueError``. A full disk names the file under ``out``, not
    under the staging folder.
    """
    import shutil

    out = Path(out)
    stage = StagedFolder(_prepare_output(out, overwrite))
    try:
        yield stage
    except BaseException as error:
        shutil.rmtree(stage.path, ignore_errors=True)
        if isinstance(error, DiskFullError) and error.filename:
            staged = Path(error.filename)
            inside = staged.is_relative_to(stage.path)
            name = out / staged.relative_to(stage.path) if inside else staged
            raise DiskFullError(
                errno.ENOSPC,
                f"disk full: could not write {name} ({out} left as it was)",
                str(name),
            ) from error
        raise
    if stage.discard:
        shutil.rmtree(stage.path, ignore_errors=True)
    else:
        _publish(stage.path, out)


def _publish(stage: Path, out: Path) -> None:
    """Put the complete staging folder at ``out``, the earlier ``out`` (if any) removed."""
    import shutil
    import tempfile

    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.replaced-"))
        os.replace(out, old / "out")
        os.replace(stage, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, out)


def align_photos(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    detector: object = "mtcnn",
    faces: str = DEFAULT_FACES,
    image_size: int = 112,
    workers: int = 0,
    device: object = None,
    report: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    min_face_size: float = 20.0,
    alignment: str = "float64",
    suffix: str | None = None,
    crop: str = "arcface",
    faces_from: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> PhotoAlignment:
    """Detect and align every photo of ``src``: ``src/NAME`` → ``out/NAME`` (same relative path
    and format; with ``faces="all"``, ``out/STEM_K.EXT`` for the K-th face, best score first).

    The crops are written into a staging folder beside ``out``, which becomes ``out`` only
    once every photo is done: a failed run leaves nothing half-written, and a run that cuts
    no crop leaves ``out`` as it was (``written == 0``).

    Args:
        src: a folder of photos (``SRC/<identity>/<image>`` for ``convert``) or one photo.
        out: the output folder; must not be, be inside or hold ``src``; a folder holding files
            is refused unless ``overwrite``.
        detector: ``"mtcnn"``, MTCNN's weights or a detector object. Default: ``"mtcnn"``.
        faces: ``"subject"``, ``"largest"``, ``"central"`` or ``"all"``
            (:func:`select_faces`). Default: ``"subject"``.
        image_size: crop side; for ``crop="arcface"`` a multiple of 112 or 128. Default: 112.
        workers: threads decoding and writing (0: one per CPU, at most 8).
        device: where the detector runs. Default: CPU.
        report: the TSV listing photos with no face, several faces, unreadable or (with
            ``faces_from``) not listed (``name<TAB>problem<TAB>detail``); written when there
            is something to list, removed otherwise. Default: ``OUT.report.tsv`` beside
            ``out`` (:func:`default_report_path`).
        progress: called with ``(done, total)`` after each photo.
        min_face_size: MTCNN's smallest face, pixels. Default: 20.
        alignment: ``"float64"`` or ``"insightface"``
            (:func:`~marginface.data.align.norm_crop`). Default: ``"float64"``.
        suffix: write every crop in this format (e.g. ``".png"``, lossless) instead of the
            photo's own. Default: None (the photo's).
        crop: how the face is cut, one of :data:`~marginface.data.face_crops.CROP_KINDS`
            (:func:`~marginface.data.face_crops.cut_face`; a model's description names its
            own, ``face_crop``). Default: ``"arcface"``.
        faces_from: ``marginface detect``'s JSON-lines file: the faces it found are cut, no
            detector runs (:func:`marginface.data.face_records.read_face_records`).
            Default: None (detect here).
        overwrite: replace the contents of an ``out`` that holds files. Default: False.

    Raises:
        ValueError: bad options or folders (named), ``out`` holding files without
            ``overwrite``, a detector that cannot be loaded, a ``faces_from`` file that is not
            ``detect``'s or names no photo of ``src``.
    """
    check_choice("faces", faces, FACE_CHOICES)
    check_choice("alignment", alignment, ALIGNMENTS)
    check_choice("crop", crop, CROP_KINDS)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {overwrite!r}")
    if crop == "arcface":
        arcface_template(image_size)  # checks image_size before any work
    else:
        check_int("image_size", image_size, minimum=2)
    cv2 = _cv2()
    src, out = Path(src), Path(out)
    photos = list_photos(src)
    check_output_folder(src, out)
    table = None
    if faces_from is not None:
        from .face_records import read_face_records

        table, _ = read_face_records(faces_from, src)
        if not any(name in table for _, name in photos):
            raise ValueError(
                f"{faces_from} names none of the {len(photos)} photo(s) of {src}: give the "
                "folder detect was run on"
            )
    report_path = Path(report) if report is not None else default_report_path(out)
    with staged_output(out, overwrite) as stage:
        counts = _align_into(
            stage.path, photos, table, detector, faces, image_size, workers, device, progress,
            min_face_size, alignment, suffix, crop, cv2,
        )  # fmt: skip
        written, lines, lists = counts
        stage.discard = not written
    if lines:
        atomic_write_text(report_path, "name\tproblem\tdetail\n" + "\n".join(lines) + "\n")
    else:
        report_path.unlink(missing_ok=True)  # an earlier run's report would mislead
    return PhotoAlignment(photos=len(photos), written=written, out=out, report=report_path, **lists)


def _align_into(
    stage: Path,
    photos: list[tuple[Path, str]],
    table: dict[str, Faces] | None,
    detector: object,
    faces: str,
    image_size: int,
    workers: int,
    device: object,
    progress: Callable[[int, int], None] | None,
    min_face_size: float,
    alignment: str,
    suffix: str | None,
    crop: str,
    cv2: object,
) -> tuple[int, list[str], dict[str, list[str]]]:
    """:func:`align_photos`'s work into ``stage``: ``(written, report lines, lists)``."""
    lists: dict[str, list[str]] = {
        "no_face": [], "several_faces": [], "unreadable": [], "unlisted": []
    }  # fmt: skip
    lines: list[str] = []
    written = 0
    root = stage.resolve()
    threads = workers if workers > 0 else min(8, os.cpu_count() or 1)

    def write(name: str, face: np.ndarray) -> None:
        target = stage / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if root not in target.resolve().parents:
            raise ValueError(f"{name}: the crop would land outside the output folder (a link?)")
        ok, encoded = cv2.imencode(target.suffix or ".png", face[:, :, ::-1])  # RGB -> BGR
        if not ok:
            raise ValueError(f"{name}: OpenCV cannot encode the format {target.suffix!r}")
        atomic_write_bytes(target, encoded.tobytes())

    if table is None:
        results = detect_photos(
            photos, detector, workers=threads, device=device, min_face_size=min_face_size
        )
    else:
        results = _listed_faces(photos, table, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = []
        for done, (name, image, found) in enumerate(results, start=1):
            if found is None:
                lists["unlisted"].append(name)
                lines.append(f"{name}\tnot_in_faces_file\tno face listed for it")
            elif isinstance(found, PhotoError):
                lists["unreadable"].append(name)
                lines.append(f"{name}\tunreadable\t{found}")
            elif found.count == 0:
                lists["no_face"].append(name)
                lines.append(f"{name}\tno_face\t")
            else:
                if found.count > 1:
                    lists["several_faces"].append(name)
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
    return written, lines, lists
