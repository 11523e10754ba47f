"""``marginface convert --detector``: training folders and verification pairs whose faces are
detected and aligned first (:mod:`marginface.data.face_photos`), so that both sets are framed
the same way; called by :func:`marginface.data.convert.convert_folder` and
:func:`~marginface.data.convert.convert_pairs`."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .framing import write_framing

__all__ = ["convert_detected_folder", "detected_framing", "pair_worker"]


def detected_framing(detector: object, faces: str, alignment: str) -> str:
    """How a set was framed with a detector, for its framing record (``"mtcnn, largest face,
    float64 alignment"``); a :class:`~marginface.detect.DetectorSpec` by its name."""
    from ..detect.choice import DetectorSpec

    if isinstance(detector, DetectorSpec):
        detector = detector.name
    name = detector if isinstance(detector, str) else Path(str(detector)).name
    if not isinstance(detector, (str, os.PathLike)):
        name = type(detector).__name__
    return f"{name}, {faces} face, {alignment} alignment"


def convert_detected_folder(
    src: str | os.PathLike[str],
    out: Path,
    size: int,
    quality: int,
    workers: int,
    detector: object,
    faces: str,
    alignment: str,
    convert_folder: Callable[..., Any],
) -> Any:
    """Detect and align into a temporary folder beside ``out`` (PNG), then
    ``convert_folder`` that (:func:`marginface.data.convert.convert_folder`, passed in: this module
    never imports ``convert``); its result with ``report`` set."""
    import dataclasses
    import tempfile

    from .face_photos import align_photos, default_report_path

    if size % 112 and size % 128:
        raise ValueError(f"image_size must be a multiple of 112 or 128 with a detector, got {size}")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = default_report_path(out)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-aligning-") as tmp:
        aligned = align_photos(
            src,
            Path(tmp) / "faces",
            detector=detector,
            faces=faces,
            image_size=size,
            workers=workers,
            report=report,
            alignment=alignment,
            suffix=".png",
        )
        if aligned.written == 0:
            raise ValueError(f"{src}: no face found in any photo (see {report})")
        result = convert_folder(
            Path(tmp) / "faces", out, image_size=size, quality=quality, workers=workers
        )
    listed = aligned.no_face or aligned.several_faces or aligned.unreadable
    write_framing(
        out / "train.rec",
        crop=None,
        image_size=size,
        source=str(src),
        detector=detected_framing(detector, faces, alignment),
    )
    return dataclasses.replace(result, report=report if listed else None)


def pair_worker(
    detector: object,
    faces: str,
    alignment: str,
    size: int,
    crop: int | None,
    quality: int,
    *,
    prepare: Callable[[bytes | Path, str, int, int | None, int], bytes],
    encode_jpeg: Callable[[Any, int], bytes],
    face_crop: str = "arcface",
) -> tuple[Callable[[bytes | Path, str], bytes], list[str]]:
    """The function encoding one pair image (detected and cut as ``face_crop`` says when
    ``detector`` is set: :func:`~marginface.data.face_crops.cut_face`; ``prepare``, the centre
    crop of ``convert``, otherwise and where no face is found) and the list it appends the
    names of images without a face to."""
    missed: list[str] = []
    if detector is None:
        return (lambda source, name: prepare(source, name, size, crop, quality)), missed
    from .._validation import check_choice
    from ..detect import load_detector
    from .align import ALIGNMENTS
    from .face_crops import CROP_KINDS, cut_face
    from .face_photos import PhotoError, read_photo, select_faces

    check_choice("faces", faces, ("subject", "largest", "central"))
    check_choice("alignment", alignment, ALIGNMENTS)
    check_choice("face_crop", face_crop, CROP_KINDS)
    if face_crop == "arcface" and size % 112 and size % 128:
        raise ValueError(f"image_size must be a multiple of 112 or 128 with a detector, got {size}")
    model = load_detector(detector)  # type: ignore[arg-type]

    def work(source: bytes | Path, name: str) -> bytes:
        try:
            image = read_photo(io.BytesIO(source) if isinstance(source, bytes) else source)
        except PhotoError as error:
            raise ValueError(f"{name}: {str(error).split(': ', 1)[-1]}") from None
        found = model.detect(image)[0]
        if found.count == 0:
            missed.append(name.rsplit(": ", 1)[-1])
            return prepare(source, name, size, crop, quality)
        k = select_faces(found, image.shape, faces)[0]
        face = cut_face(
            image,
            found.landmarks[k],
            found.boxes[k],
            crop=face_crop,
            size=size,
            alignment=alignment,
        )
        return encode_jpeg(face, quality)

    return work, missed
