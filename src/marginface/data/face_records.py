"""Reading ``marginface detect``'s output back: one JSON line per face, grouped by photo.

``detect PHOTOS --out faces.jsonl`` writes ``{"file", "box": [x1, y1, x2, y2], "score",
"landmarks": [[x, y] x 5]}`` per face (photo pixels); :func:`read_face_records` turns that file
into ``{name: Faces}`` with ``name`` the photo's path relative to the folder ``align`` reads,
so ``align SRC faces.jsonl OUT`` cuts the faces already found instead of detecting them again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..detect import Faces

__all__ = ["is_face_records", "read_face_records"]


def is_face_records(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a ``detect`` output: a ``.jsonl`` name, or a first non-blank line
    that is a JSON object (insightface's landmark files and CSVs are neither)."""
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.strip():
                    return line.lstrip().startswith("{")
    except OSError:
        return False
    return False


def _numbers(value: object, shape: tuple[int, ...], what: str, where: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.shape != shape or not np.isfinite(array).all():
        raise ValueError(f"{where}: {what} must be {shape} finite numbers, got {value!r}")
    return array


def _photo_name(file: str, src: Path, records: Path) -> str | None:
    """The path of ``file`` relative to ``src``: ``file`` as written (relative to the working
    folder, or absolute) when it lies inside ``src``, else ``src / file``, else relative to
    the records' folder; None when none of these is a file inside ``src``."""
    root = src.resolve()
    for candidate in (Path(file), src / file, records.parent / file):
        if not candidate.is_file():
            continue
        try:
            return candidate.resolve().relative_to(root).as_posix()
        except ValueError:
            continue
    return None


def read_face_records(
    path: str | os.PathLike[str], src: str | os.PathLike[str]
) -> tuple[dict[str, Faces], list[str]]:
    """The faces ``detect`` found, per photo of ``src``.

    Args:
        path: the JSON-lines file (``marginface detect --out``).
        src: the photo folder (or one photo) the names are resolved against: a record's
            ``file`` is taken as written (working folder or absolute), then under ``src``,
            then beside ``path``, and must be a file inside ``src``.

    Returns:
        ``(faces, elsewhere)``: ``{relative name: Faces}`` (boxes ``float32[K, 4]``, scores
        ``float32[K]``, landmarks ``float32[K, 5, 2]``, best score first), and the records'
        files that are not inside ``src`` (left out).

    Raises:
        ValueError: a line that is not such a record (``path:line: what``); no records.
        OSError: ``path`` cannot be read.
    """
    path, src = Path(path), Path(src)
    folder = src if src.is_dir() else src.parent
    grouped: dict[str, list[tuple[float, np.ndarray, np.ndarray]]] = {}
    elsewhere: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not a JSON line ({error.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("file"), str):
                raise ValueError(
                    f'{where}: expected marginface detect\'s {{"file", "box", "score", '
                    f'"landmarks"}}, got {line.strip()[:80]!r}'
                )
            box = _numbers(record.get("box"), (4,), "box", where)
            landmarks = _numbers(record.get("landmarks"), (5, 2), "landmarks", where)
            score = float(_numbers(record.get("score", 1.0), (), "score", where))
            name = _photo_name(record["file"], folder, path)
            if name is None:
                elsewhere.append(record["file"])
                continue
            grouped.setdefault(name, []).append((score, box, landmarks))
    if not grouped and not elsewhere:
        raise ValueError(f"{path} holds no face records (marginface detect writes them)")
    faces = {}
    for name, found in grouped.items():
        found.sort(key=lambda item: -item[0])  # best score first, as the detectors give
        faces[name] = Faces(
            boxes=np.stack([b for _, b, _ in found]).astype(np.float32),
            scores=np.asarray([s for s, _, _ in found], dtype=np.float32),
            landmarks=np.stack([m for _, _, m in found]).astype(np.float32),
        )
    return faces, sorted(set(elsewhere))
