"""Writing ``marginface detect``'s output: one JSON line per face, and the report of photos
with no face or unreadable (:func:`marginface.data.face_records.read_face_records` reads the
lines back).

Each line is ``{"file", "box": [x1, y1, x2, y2], "score", "landmarks": [[x, y] x 5]}`` in photo
pixels (box and landmarks rounded to 1/1000 px, score to 1e-6), faces in the order detected,
best score first. The report is a TSV ``name<TAB>problem<TAB>detail`` (``no_face`` or
``unreadable``), written when there is something to list and removed otherwise, so the report
beside the output is always this run's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._atomic import atomic_write_text
from ..detect import Faces
from .face_photos import PhotoError, default_report_path

__all__ = ["FaceRecordsFile", "write_face_records"]


@dataclass(frozen=True)
class FaceRecordsFile:
    """What :func:`write_face_records` wrote.

    Attributes:
        out: the JSON-lines file.
        report: the report's path (written only when ``problems`` > 0).
        photos: photos read.
        faces: faces written (lines of ``out``).
        problems: photos with no face or unreadable, listed in ``report``.
    """

    out: Path
    report: Path
    photos: int
    faces: int
    problems: int


def write_face_records(
    results: Iterable[tuple[str, np.ndarray | None, Faces | PhotoError]],
    out: str | os.PathLike[str],
    *,
    total: int,
    report: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FaceRecordsFile:
    """Write the faces of ``results`` (:func:`marginface.data.face_photos.detect_photos`'s
    ``(name, image, Faces | PhotoError)`` per photo) as JSON lines to ``out``, and the photos
    with no face or unreadable to ``report``, both atomically.

    Args:
        results: one ``(name, image, found)`` per photo.
        out: the JSON-lines file (not a folder).
        total: the number of photos, for ``progress``.
        report: the TSV of problems. Default: ``OUT.report.tsv``
            (:func:`~marginface.data.face_photos.default_report_path`).
        progress: called with ``(done, total)`` after each photo. Default: None.

    Returns:
        :class:`FaceRecordsFile`.

    Raises:
        ValueError: ``out`` is a folder; no face in any photo (nothing is written to ``out``;
            the report lists why).
    """
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"out {out} is a folder; give the JSON-lines file to write")
    report = Path(report) if report is not None else default_report_path(out)
    lines: list[str] = []
    problems: list[str] = []
    photos = 0
    for name, _, found in results:
        photos += 1
        if isinstance(found, PhotoError):
            problems.append(f"{name}\tunreadable\t{found}")
        else:
            if found.count == 0:
                problems.append(f"{name}\tno_face\t")
            for k in range(found.count):
                record = {
                    "file": name,
                    "box": [round(float(v), 3) for v in found.boxes[k]],
                    "score": round(float(found.scores[k]), 6),
                    "landmarks": [[round(float(v), 3) for v in p] for p in found.landmarks[k]],
                }
                lines.append(json.dumps(record))
        if progress is not None:
            progress(photos, total)
    if problems:
        atomic_write_text(report, "name\tproblem\tdetail\n" + "\n".join(problems) + "\n")
    else:
        report.unlink(missing_ok=True)  # an earlier run's report would mislead
    if not lines:
        raise ValueError(
            f"no face found in {photos} photo(s) (listed in {report}); nothing written to {out}"
        )
    atomic_write_text(out, "".join(line + "\n" for line in lines))
    return FaceRecordsFile(out, report, photos, len(lines), len(problems))
